"""Accuracy of a masked diffusion LM on a task: batched masked-diffusion sampling, then the task's correctness reward.

`evaluate_model` renders every prompt as the trainer does (chat template with the generation prompt for
conversational prompts, the text as is otherwise), left-pads batches of prompts (padding hidden from attention, so a
row's completion does not depend on its batch at temperature 0), samples completions with the model family's
rollout sampler with a `SamplerSettings` (LLaDA's for LLaDA and masked LMs, Dream's for Dream / DiffuCoder, or the one
`diffusion_sampler` names, as in the trainer's rollouts), decodes each completion up to its first EOS / end-of-turn token without
special tokens (as TRL does), and scores it with the reward following TRL's protocol
`reward(prompts, completions, **columns)`. All randomness comes from one `torch.Generator` seeded with `seed`.

Grading (`grading`, for a task):
- "tagged": the task's correctness reward (1 / 0); accuracy = mean reward over the rows it scores (a None reward,
  TRL's "not applicable", is left out). A reward function passed directly is graded the same way ("custom").
- "official": the task's official StableDRL reward (`TaskSpec.official_reward`, without the anti-short-boxed term);
  accuracy = fraction of the scored rows whose score is the task's full score (`TaskSpec.official_full_score`:
  GSM8K / MATH +1 of +-1, Countdown 1 of 1 / 0.1 / 0, Sudoku 1.0 = every blank cell right).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from .diffusion.adapter import DiffusionAdapter
from .diffusion.family import as_diffusion_lm
from .diffusion.sampler_settings import SamplerSettings


def resolve_reward(reward_func_or_task) -> Callable:
    """A reward function from a callable, a `TaskSpec` (its correctness reward) or a registered task name."""
    from .tasks import TaskSpec, get_task

    if isinstance(reward_func_or_task, str):
        return get_task(reward_func_or_task).correctness_reward
    if isinstance(reward_func_or_task, TaskSpec):
        return reward_func_or_task.correctness_reward
    if callable(reward_func_or_task):
        return reward_func_or_task
    raise ValueError(
        f"reward_func_or_task must be a task name, a TaskSpec or a reward function, got {reward_func_or_task!r}."
    )


GRADINGS = ("tagged", "official")


def resolve_grading(reward_func_or_task, grading: str | None = None) -> tuple[Callable, str, float | None]:
    """(reward function, grading name, full score): the full score is None when accuracy is the mean reward.

    grading: "tagged" (default for a task), "official", or None; a reward function passed directly is "custom".
    """
    from .tasks import TaskSpec, get_task

    if grading is not None and grading not in GRADINGS:
        raise ValueError(f"grading={grading!r}; choose one of {', '.join(GRADINGS)} (or None for 'tagged').")
    task = get_task(reward_func_or_task) if isinstance(reward_func_or_task, str) else reward_func_or_task
    if not isinstance(task, TaskSpec):
        if grading == "official":
            raise ValueError(
                "grading='official' grades with a task's official reward: pass the task (its name or TaskSpec) "
                "instead of a reward function."
            )
        return resolve_reward(reward_func_or_task), "custom", None
    if grading == "official":
        if task.official_reward is None:
            raise ValueError(
                f"grading='official': task {task.name!r} has no official StableDRL grading; use grading='tagged'."
            )
        return task.official_reward, "official", task.official_full_score
    return task.correctness_reward, "tagged", None


GRADING_RULES = {
    "tagged": "mean of the task's tagged correctness reward (1 / 0)",
    "official": "fraction of completions whose official StableDRL score is the task's full score",
    "custom": "mean of the given reward function",
}


def render_prompt(tokenizer, prompt) -> str:
    """The prompt text the model sees: chat messages through the chat template with the generation prompt."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token id lists into (ids (B, P), mask (B, P)), 1 on real tokens."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long)  # (B, P)
    mask = torch.zeros(len(sequences), length, dtype=torch.long)  # (B, P)
    for row, sequence in enumerate(sequences):
        if sequence:
            ids[row, length - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
            mask[row, length - len(sequence) :] = 1
    return ids, mask


def _device_of(adapter: DiffusionAdapter) -> torch.device:
    try:
        return next(adapter.model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


@torch.no_grad()
def evaluate_model(
    model,
    tokenizer,
    dataset,
    reward_func_or_task,
    *,
    settings: SamplerSettings,
    batch_size: int = 32,
    seed: int = 0,
    progress: bool = True,
    desc: str = "evaluating",
    grading: str | None = None,
) -> dict:
    """Sample one completion per row of `dataset` and score it; returns accuracy, n and per-sample records.

    model: a LLaDA / Dream / masked LM (possibly a PEFT model, never merged here) or a `DiffusionAdapter`.
    dataset: rows with a "prompt" column (chat messages or text) and the columns the reward reads (a list of dicts
        or a `datasets.Dataset`).
    reward_func_or_task: a TRL-style reward function, a `TaskSpec` or a registered task name (its correctness
        reward is used).
    settings: the sampler settings (`SamplerSettings.from_config(config)` decodes as that config's training
        rollouts; `SamplerSettings.from_fields(...)` from StableDRLConfig field names); the family runs its sampler
        with them exactly as in training.
    progress / desc: show a tqdm bar over batches with this label.
    grading: for a task, "tagged" (None: the correctness reward) or "official" (the official StableDRL reward;
        accuracy counts completions earning the full score); see the module docstring.
    Returns {"accuracy", "n" (rows scored), "num_rows", "grading", "grading_rule", "full_score" (official: the score
    counted as correct, else None), "records": [{"prompt", "completion", "answer", "reward"}]} ("correct" is added
    to each record under official grading), where "prompt" is the rendered prompt text and "answer" the row's
    "answer" column (None when absent).
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    reward_func, grading, full_score = resolve_grading(reward_func_or_task, grading)
    if not isinstance(settings, SamplerSettings):
        raise TypeError(
            f"settings must be a SamplerSettings, got {type(settings).__name__}; build it with "
            "SamplerSettings.from_config(config) or SamplerSettings.from_fields(max_completion_length=..., ...)."
        )
    adapter = model if isinstance(model, DiffusionAdapter) else as_diffusion_lm(model, tokenizer)
    family = adapter.family_object
    # what the model decides (the sampler "auto" picks, the block size), then the chosen sampler's own arguments
    family.check_rollout_settings(settings, adapter)
    rows = [dict(row) for row in dataset]
    if not rows:
        raise ValueError("dataset is empty; pass at least one row to evaluate.")
    if "prompt" not in rows[0]:
        raise ValueError(f"dataset needs a 'prompt' column, got columns {sorted(rows[0])}.")

    device = _device_of(adapter)
    generator = torch.Generator(device=device).manual_seed(seed)
    module = adapter.model if isinstance(adapter.model, torch.nn.Module) else None
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()

    records = []
    try:
        batches = range(0, len(rows), batch_size)
        for start in tqdm(batches, desc=desc, unit="batch", disable=not progress):
            batch = rows[start : start + batch_size]
            prompt_texts = [render_prompt(tokenizer, row["prompt"]) for row in batch]
            prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in prompt_texts]
            ids, mask = left_pad(prompt_ids, adapter.pad_token_id)  # (B, P), (B, P)
            out = family.generate(
                adapter,
                ids.to(device),
                mask.to(device),
                settings,
                eos_token_ids=adapter.eos_token_ids,
                generator=generator,
            )
            texts = [
                tokenizer.decode(row_ids[row_mask.bool()].tolist(), skip_special_tokens=True)
                for row_ids, row_mask in zip(out.completion_ids.cpu(), out.completion_mask.cpu())
            ]
            # TRL hands conversational datasets' completions to rewards as assistant messages.
            completions = [
                text if isinstance(row["prompt"], str) else [{"role": "assistant", "content": text}]
                for text, row in zip(texts, batch)
            ]
            columns = {key: [row.get(key) for row in batch] for key in batch[0] if key != "prompt"}
            rewards = reward_func(prompts=[row["prompt"] for row in batch], completions=completions, **columns)
            if len(rewards) != len(batch):
                raise ValueError(f"the reward function returned {len(rewards)} rewards for {len(batch)} completions.")
            for row, prompt_text, text, reward in zip(batch, prompt_texts, texts, rewards):
                records.append(
                    {
                        "prompt": prompt_text,
                        "completion": text,
                        "answer": row.get("answer"),
                        "reward": None if reward is None else float(reward),
                    }
                )
    finally:
        if module is not None and was_training:
            module.train()

    if full_score is not None:  # official grading: a completion is right when it earns the full score
        for record in records:
            record["correct"] = None if record["reward"] is None else record["reward"] >= full_score
        scored = [float(r["correct"]) for r in records if r["correct"] is not None]
    else:
        scored = [r["reward"] for r in records if r["reward"] is not None]
    accuracy = sum(scored) / len(scored) if scored else float("nan")
    return {
        "accuracy": accuracy,
        "n": len(scored),
        "num_rows": len(records),
        "grading": grading,
        "grading_rule": GRADING_RULES[grading],
        "full_score": full_score,
        "records": records,
    }


def evaluate_draws(
    model,
    tokenizer,
    dataset,
    reward_func_or_task,
    *,
    draws: int = 4,
    seed: int = 0,
    greedy: bool = True,
    settings: SamplerSettings,
    **kwargs,
) -> dict:
    """Held-out accuracy as the mean over `draws` sampled evaluations, with its spread, and optionally greedy.

    A single sampled evaluation is noisy (at temperature 0.9 one model's accuracy on 512 prompts ranged over
    0.05 between draws), so objectives are compared on the mean of several draws. Draw d samples every completion
    with its own `torch.Generator` seeded with `seed + d`, so the draws differ from each other and each is
    reproducible; two models evaluated with the same `seed` see the same generator streams.
    settings: the sampler settings of the draws (at `settings.temperature`); greedy decodes with them at temperature 0.
    kwargs: the other `evaluate_model` arguments (batch_size, grading, progress), the same for every draw.

    Returns {"mean", "std" (sample standard deviation over draws, n - 1; 0 for one draw), "draws" (accuracy per
    draw), "seeds", "temperature", "greedy" (accuracy at temperature 0, or None when greedy is False), "n" (rows
    scored), "grading"}.
    """
    from .results import mean_std

    if not isinstance(draws, int) or isinstance(draws, bool) or draws < 1:
        raise ValueError(f"draws must be a positive integer, got {draws!r}; use at least 4 to compare models.")
    kwargs.pop("desc", None)
    if not isinstance(settings, SamplerSettings):
        raise TypeError(f"settings must be a SamplerSettings, got {type(settings).__name__}.")
    seeds = [seed + d for d in range(draws)]
    results = [
        evaluate_model(
            model, tokenizer, dataset, reward_func_or_task, settings=settings, seed=s, desc=f"draw {d}", **kwargs
        )
        for d, s in enumerate(seeds)
    ]
    accuracies = [r["accuracy"] for r in results]
    mean, std = mean_std(accuracies)
    greedy_accuracy = None
    if greedy:
        greedy_accuracy = evaluate_model(
            model,
            tokenizer,
            dataset,
            reward_func_or_task,
            settings=dataclasses.replace(settings, temperature=0.0),  # 0 is valid for every sampler
            seed=seed,
            desc="greedy",
            **kwargs,
        )["accuracy"]
    return {
        "mean": mean,
        "std": std,
        "draws": accuracies,
        "seeds": seeds,
        "temperature": settings.temperature,
        "greedy": greedy_accuracy,
        "n": results[0]["n"],
        "grading": results[0]["grading"],
    }
