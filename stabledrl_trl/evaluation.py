"""Accuracy of a masked diffusion LM on a task: batched masked-diffusion sampling, then the task's correctness reward.

`evaluate_model` renders every prompt as the trainer does (chat template with the generation prompt for
conversational prompts, the text as is otherwise), left-pads batches of prompts (padding hidden from attention, so a
row's completion does not depend on its batch at temperature 0), samples completions with LLaDA's sampler
(`stabledrl_trl.diffusion.sampler.generate`; block-diffusion models such as SDAR with their cached block sampler,
`stabledrl_trl.diffusion.block_sampler.block_generate`), decodes each completion up to its first EOS / end-of-turn token without
special tokens (as TRL does), and scores it with the reward following TRL's protocol
`reward(prompts, completions, **columns)`. Accuracy is the mean reward over the rows the reward scores (a None
reward, TRL's "not applicable", is left out). All randomness comes from one `torch.Generator` seeded with `seed`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from .diffusion.adapter import DiffusionAdapter, as_diffusion_lm, unwrap_model
from .diffusion.block_sampler import block_generate, validate_block_sampler_args
from .diffusion.sampler import generate, validate_sampler_args


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
    batch_size: int = 32,
    seed: int = 0,
    progress: bool = True,
    desc: str = "evaluating",
    block_denoising_steps: int | None = None,
    block_remasking: str = "low_confidence_dynamic",
    block_confidence_threshold: float = 0.9,
    top_k: int = 0,
    top_p: float = 1.0,
) -> dict:
    """Sample one completion per row of `dataset` and score it; returns accuracy, n and per-sample records.

    model: a LLaDA / Dream / masked LM (possibly a PEFT model, never merged here) or a `DiffusionAdapter`.
    dataset: rows with a "prompt" column (chat messages or text) and the columns the reward reads (a list of dicts
        or a `datasets.Dataset`).
    reward_func_or_task: a TRL-style reward function, a `TaskSpec` or a registered task name (its correctness
        reward is used).
    progress / desc: show a tqdm bar over batches with this label.
    block_denoising_steps, block_remasking, block_confidence_threshold, top_k, top_p: the block sampler's settings,
        used (with gen_length and temperature) instead of block_length / steps / remasking / cfg_scale when the model
        is a block-diffusion model (family "sdar"); block size from the model config.
    Returns {"accuracy", "n" (rows scored), "num_rows", "records": [{"prompt", "completion", "answer", "reward"}]},
    where "prompt" is the rendered prompt text and "answer" the row's "answer" column (None when absent).
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    reward_func = resolve_reward(reward_func_or_task)
    adapter = model if isinstance(model, DiffusionAdapter) else as_diffusion_lm(model, tokenizer)
    block_size = int(unwrap_model(adapter.model).config.block_size) if adapter.family == "sdar" else None
    if block_size is None:
        validate_sampler_args(gen_length, block_length, steps, temperature, remasking, cfg_scale, adapter.mask_token_id)
    else:
        validate_block_sampler_args(gen_length, block_size, block_denoising_steps or block_size, temperature, top_k,
                                    top_p, block_remasking, block_confidence_threshold)  # fmt: skip
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
            if block_size is None:
                out = generate(
                    adapter,
                    ids.to(device),
                    mask.to(device),
                    mask_token_id=adapter.mask_token_id,
                    gen_length=gen_length,
                    block_length=block_length,
                    steps=steps,
                    temperature=temperature,
                    remasking=remasking,
                    cfg_scale=cfg_scale,
                    eos_token_ids=adapter.eos_token_ids,
                    generator=generator,
                )
            else:
                out = block_generate(
                    adapter.model,
                    ids.to(device),
                    mask.to(device),
                    mask_token_id=adapter.mask_token_id,
                    eos_token_ids=adapter.eos_token_ids,
                    pad_token_id=adapter.pad_token_id,
                    block_size=block_size,
                    gen_length=gen_length,
                    denoising_steps=block_denoising_steps,
                    temperature=temperature,
                    top_k=top_k,
                    top_p=top_p,
                    remasking=block_remasking,
                    confidence_threshold=block_confidence_threshold,
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

    scored = [r["reward"] for r in records if r["reward"] is not None]
    accuracy = sum(scored) / len(scored) if scored else float("nan")
    return {"accuracy": accuracy, "n": len(scored), "num_rows": len(records), "records": records}
