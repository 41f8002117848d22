"""Accuracy of a masked diffusion LM on a task: batched masked-diffusion sampling, then the task's correctness reward.

`evaluate_model` renders every prompt as the trainer does (chat template with the generation prompt for
conversational prompts, the text as is otherwise), left-pads batches of prompts (padding hidden from attention, so a
row's completion does not depend on its batch at temperature 0), samples completions with the model family's
rollout sampler (LLaDA's for LLaDA and masked LMs, Dream's for Dream / DiffuCoder, or the one `sampler` names; the
same choice as the trainer's `diffusion_sampler`), decodes each completion up to its first EOS / end-of-turn token without
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

from collections.abc import Callable
from types import SimpleNamespace

import torch
from tqdm.auto import tqdm

from .diffusion.adapter import DiffusionAdapter, as_diffusion_lm
from .diffusion.dream_sampler import validate_dream_sampler_args
from .diffusion.family import get_family
from .diffusion.sampler import validate_sampler_args


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
    gen_length: int,
    block_length: int,
    steps: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    cfg_scale: float = 0.0,
    sampler: str = "auto",
    dream_alg: str = "entropy",
    dream_alg_temp: float = 0.0,
    dream_eps: float = 1e-3,
    top_p: float = 1.0,
    top_k: int = 0,
    block_denoising_steps: int | None = None,
    block_remasking: str = "low_confidence_dynamic",
    block_confidence_threshold: float = 0.9,
    batch_size: int = 32,
    seed: int = 0,
    progress: bool = True,
    desc: str = "evaluating",
    grading: str | None = None,
    rollout_cache: str = "none",
    parallel_threshold: float | None = None,
    max_tokens_per_step: int | None = None,
) -> dict:
    """Sample one completion per row of `dataset` and score it; returns accuracy, n and per-sample records.

    model: a LLaDA / Dream / masked LM (possibly a PEFT model, never merged here) or a `DiffusionAdapter`.
    dataset: rows with a "prompt" column (chat messages or text) and the columns the reward reads (a list of dicts
        or a `datasets.Dataset`).
    reward_func_or_task: a TRL-style reward function, a `TaskSpec` or a registered task name (its correctness
        reward is used).
    sampler, dream_alg, dream_alg_temp, dream_eps, top_p, top_k, block_*: as `StableDRLConfig`'s diffusion_sampler
        and fields of the same names ("auto" = the family's own sampler; top_p 1.0 / top_k 0 = no filtering; the
        block_* fields drive block-diffusion models).
    progress / desc: show a tqdm bar over batches with this label.
    rollout_cache, parallel_threshold, max_tokens_per_step: LLaDA's approximate rollout modes, as the
        `StableDRLConfig` fields of the same names (defaults: exact decoding).
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
    adapter = model if isinstance(model, DiffusionAdapter) else as_diffusion_lm(model, tokenizer)
    # The trainer's config fields, so the family picks and runs its sampler exactly as in training rollouts.
    settings = SimpleNamespace(
        max_completion_length=gen_length,
        block_length=block_length,
        diffusion_steps=steps,
        temperature=temperature,
        remasking=remasking,
        cfg_scale=cfg_scale,
        diffusion_sampler=sampler,
        dream_alg=dream_alg,
        dream_alg_temp=dream_alg_temp,
        dream_eps=dream_eps,
        top_p=top_p,
        top_k=top_k,
        block_denoising_steps=block_denoising_steps,
        block_remasking=block_remasking,
        block_confidence_threshold=block_confidence_threshold,
        rollout_cache=rollout_cache,
        parallel_threshold=parallel_threshold,
        max_tokens_per_step=max_tokens_per_step,
    )
    if sampler not in ("auto", "llada", "dream"):
        raise ValueError(f"sampler={sampler!r}; choose 'auto' (the model family's own), 'llada' or 'dream'.")
    family = get_family(adapter.family)
    family.check(settings, adapter.model)
    if family.sampler_name(settings) == "dream":
        validate_dream_sampler_args(
            gen_length, steps, dream_alg, dream_alg_temp, dream_eps, temperature, top_p, top_k if top_k else None
        )
    elif family.sampler_name(settings) == "llada":  # families with their own sampler validate in `generate`
        validate_sampler_args(
            gen_length, block_length, steps, temperature, remasking, cfg_scale, adapter.mask_token_id
        )
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
    temperature: float,
    **kwargs,
) -> dict:
    """Held-out accuracy as the mean over `draws` sampled evaluations, with its spread, and optionally greedy.

    A single sampled evaluation is noisy (at temperature 0.9 one model's accuracy on 512 prompts ranged over
    0.05 between draws), so objectives are compared on the mean of several draws. Draw d samples every completion
    with its own `torch.Generator` seeded with `seed + d`, so the draws differ from each other and each is
    reproducible; two models evaluated with the same `seed` see the same generator streams.
    kwargs: the other `evaluate_model` arguments (gen_length, block_length, steps, ...), the same for every draw.

    Returns {"mean", "std" (sample standard deviation over draws, n - 1; 0 for one draw), "draws" (accuracy per
    draw), "seeds", "temperature", "greedy" (accuracy at temperature 0, or None when greedy is False), "n" (rows
    scored), "grading"}.
    """
    from .results import mean_std

    if not isinstance(draws, int) or isinstance(draws, bool) or draws < 1:
        raise ValueError(f"draws must be a positive integer, got {draws!r}; use at least 4 to compare models.")
    kwargs.pop("desc", None)
    seeds = [seed + d for d in range(draws)]
    results = [
        evaluate_model(
            model, tokenizer, dataset, reward_func_or_task, temperature=temperature, seed=s, desc=f"draw {d}", **kwargs
        )
        for d, s in enumerate(seeds)
    ]
    accuracies = [r["accuracy"] for r in results]
    mean, std = mean_std(accuracies)
    greedy_accuracy = None
    if greedy:
        greedy_accuracy = evaluate_model(
            model, tokenizer, dataset, reward_func_or_task, temperature=0.0, seed=seed, desc="greedy", **kwargs
        )["accuracy"]
    return {
        "mean": mean,
        "std": std,
        "draws": accuracies,
        "seeds": seeds,
        "temperature": temperature,
        "greedy": greedy_accuracy,
        "n": results[0]["n"],
        "grading": results[0]["grading"],
    }
