"""LLaDA's masked-diffusion sampler: semi-autoregressive blocks, low-confidence (or random) remasking.

The completion starts as `gen_length` mask tokens appended after the (left-padded) prompt. It is filled block by
block (`block_length` tokens each, left to right); each block gets `steps // num_blocks` denoising steps. At every
step the model predicts all positions at once, a candidate token is drawn for every masked position of the current
block (argmax at temperature 0, Gumbel-max sampling otherwise), and the `k` masked positions with the highest
confidence are revealed, `k` following LLaDA's uniform schedule. Revealed tokens are never changed again.

The model is any callable `logits_fn(input_ids (B, L), attention_mask (B, L) or None) -> logits (B, L, V)` whose
logits are aligned with the input positions (shift Dream-style logits in the adapter). For a left-padded batch the
callee must mask the pad positions out of attention while keeping attention bidirectional; a row then gives the
same output as the row alone (RoPE depends only on relative positions).

Differences from LLaDA's reference code (the first two leave the result unchanged):
- candidates, noise and confidences are computed for the current block's positions only, (B, block_length, V)
  instead of (B, L, V): LLaDA gives every position outside the block -inf confidence anyway (earlier blocks are
  fully revealed, later ones are excluded), so those candidates are never used;
- Gumbel-max in log space, argmax(logits - T * log(-log u)) in float64, the same argmax as LLaDA's
  exp(logits) / (-log u)^T without its overflow for large logits or temperatures;
- the mask token is never a candidate (its logit is set to -inf): a "revealed" mask token would leave the
  position masked behind the block. A trained LLaDA gives the mask token a negligible probability, so this only
  matters for untrained models;
- guidance and confidences are computed in at least float32 (LLaDA uses the model's dtype: bf16 probabilities tie
  often, and ties make the reveal order arbitrary);
- randomness comes only from the `generator` argument; random remasking scores are float64 (ties practically
  impossible) and, like the Gumbel noise, drawn for the current block only, so a row's draws depend only on its
  batch index, not on the prompt lengths.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

LogitsFn = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]

REMASKING_MODES = ("low_confidence", "random")


@dataclass
class SamplerOutput:
    """What `generate` returns."""

    completion_ids: torch.Tensor  # (B, gen_length) long
    completion_mask: torch.Tensor  # (B, gen_length) long: 1 up to and including the first EOS token, 0 after


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate_sampler_args(gen_length, block_length, steps, temperature, remasking, cfg_scale, mask_token_id) -> None:
    """Raise a ValueError naming the argument, its value and the fix for any invalid sampler setting."""
    if not _is_int(gen_length) or gen_length < 1:
        raise ValueError(f"gen_length must be a positive integer, got {gen_length!r}.")
    if not _is_int(block_length) or block_length < 1:
        raise ValueError(f"block_length must be a positive integer, got {block_length!r}.")
    if gen_length % block_length != 0:
        raise ValueError(
            f"block_length={block_length} must divide gen_length={gen_length}; choose a block_length that is a "
            f"divisor of gen_length (e.g. {math.gcd(gen_length, block_length)}) or change gen_length."
        )
    num_blocks = gen_length // block_length
    if not _is_int(steps) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}.")
    if steps < num_blocks:
        raise ValueError(
            f"steps={steps} is fewer than the number of blocks gen_length // block_length = {num_blocks}; every "
            f"block needs at least one step: use steps >= {num_blocks} (a multiple of {num_blocks})."
        )
    if steps % num_blocks != 0:
        raise ValueError(
            f"steps={steps} must be divisible by the number of blocks gen_length // block_length = {num_blocks} "
            f"(steps are split evenly across blocks); use e.g. steps={num_blocks * max(1, steps // num_blocks)}."
        )
    if not _is_number(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}.")
    if remasking not in REMASKING_MODES:
        raise ValueError(f"remasking must be one of {REMASKING_MODES}, got {remasking!r}.")
    if not _is_number(cfg_scale) or not math.isfinite(cfg_scale) or cfg_scale < 0:
        raise ValueError(f"cfg_scale must be a finite number >= 0 (0 disables guidance), got {cfg_scale!r}.")
    if mask_token_id is None:
        raise ValueError(
            "mask_token_id is None: a masked diffusion sampler needs the model's mask token id "
            "(e.g. 126336 for LLaDA-8B, tokenizer.mask_token_id); pass mask_token_id=..."
        )
    if not _is_int(mask_token_id) or mask_token_id < 0:
        raise ValueError(f"mask_token_id must be a non-negative integer token id, got {mask_token_id!r}.")


def _validate_prompt(prompt_ids, prompt_mask, mask_token_id) -> None:
    if not isinstance(prompt_ids, torch.Tensor) or prompt_ids.dim() != 2 or prompt_ids.dtype != torch.long:
        desc = f"{tuple(prompt_ids.shape)} {prompt_ids.dtype}" if isinstance(prompt_ids, torch.Tensor) else prompt_ids
        raise ValueError(f"prompt_ids must be a (batch, prompt_length) torch.long tensor, got {desc!r}.")
    if prompt_ids.shape[0] == 0:
        raise ValueError("prompt_ids has an empty batch dimension; pass at least one prompt.")
    if prompt_mask is not None:
        if not isinstance(prompt_mask, torch.Tensor) or prompt_mask.shape != prompt_ids.shape:
            shape = tuple(prompt_mask.shape) if isinstance(prompt_mask, torch.Tensor) else prompt_mask
            raise ValueError(
                f"prompt_mask must be a tensor of prompt_ids' shape {tuple(prompt_ids.shape)}, got {shape!r}."
            )
        if not bool(((prompt_mask == 0) | (prompt_mask == 1)).all()):
            raise ValueError("prompt_mask must hold only 0 (padding) and 1 (prompt token).")
        # Left padding: the completion is appended after the last column, so padding must come first.
        if prompt_mask.shape[1] > 1 and bool((prompt_mask[:, 1:] < prompt_mask[:, :-1]).any()):
            raise ValueError(
                "prompt_mask is not left-padded (a 0 follows a 1 in some row); the completion is appended after "
                "the last column, so pad prompts on the left (tokenizer.padding_side = 'left')."
            )
    real = prompt_ids == mask_token_id  # (B, P)
    if prompt_mask is not None:
        real = real & prompt_mask.bool()
    if bool(real.any()):
        raise ValueError(
            f"prompt_ids contains mask_token_id={mask_token_id} at real (non-padding) prompt positions; the sampler "
            "only fills the completion. Remove mask tokens from the prompt (and if the pad id equals the mask id, "
            "pass prompt_mask so pad positions are known)."
        )


def uniform_reveal_schedule(num_masked: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's uniform schedule: split each row's masked count over `steps`, the remainder going to the first steps.

    num_masked: (B,) integer tensor. Returns (B, steps) long tensor whose rows sum to num_masked.
    """
    num_masked = num_masked.long()  # (B,)
    base = num_masked // steps  # (B,)
    remainder = num_masked % steps  # (B,)
    step_index = torch.arange(steps, device=num_masked.device)  # (steps,)
    return base[:, None] + (step_index[None, :] < remainder[:, None]).long()  # (B, steps)


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_token_ids: Iterable[int]) -> torch.Tensor:
    """1 up to and including the first token in `eos_token_ids`, 0 after it; all ones for a row without EOS.

    completion_ids: (B, T). Returns (B, T) long.
    """
    eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=completion_ids.device)  # (E,)
    if eos.numel() == 0:
        return torch.ones_like(completion_ids, dtype=torch.long)
    is_eos = torch.isin(completion_ids, eos).long()  # (B, T)
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos  # (B, T) EOS tokens strictly before each position
    return (eos_before == 0).long()  # (B, T)


def _normalise_eos_ids(eos_token_ids) -> tuple[int, ...]:
    if eos_token_ids is None:
        return ()
    if _is_int(eos_token_ids):
        return (eos_token_ids,)
    ids = tuple(eos_token_ids)
    if not all(_is_int(i) for i in ids):
        raise ValueError(f"eos_token_ids must be an int or a sequence of ints, got {eos_token_ids!r}.")
    return ids


@torch.no_grad()
def generate(
    logits_fn: LogitsFn,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor | None = None,
    *,
    mask_token_id: int,
    gen_length: int = 256,
    block_length: int = 32,
    steps: int = 128,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    cfg_scale: float = 0.0,
    eos_token_ids: Iterable[int] | int = (),
    generator: torch.Generator | None = None,
) -> SamplerOutput:
    """Generate `gen_length` tokens after each (left-padded) prompt with LLaDA's masked-diffusion sampler.

    logits_fn: `(input_ids (B, L), attention_mask (B, L) or None) -> logits (B, L, V)`. It receives None when
        `prompt_mask` is None, else the prompt mask followed by ones for the completion; it must then mask pad
        positions out of attention (bidirectionally), or rows of a padded batch will differ from the rows alone.
    prompt_ids: (B, P) long, left-padded. prompt_mask: (B, P) of 0/1 or None (no padding).
    temperature: 0 = argmax; > 0 = sample from softmax(logits / temperature) via Gumbel-max in float64.
    remasking: "low_confidence" reveals the masked positions whose drawn token has the highest probability;
        "random" reveals uniformly random masked positions.
    cfg_scale: classifier-free guidance; > 0 adds a pass with the prompt masked and uses
        un + (cfg_scale + 1) * (cond - un).
    generator: torch.Generator on the logits' device; required when temperature > 0 or remasking == "random".
        Noise is drawn per step with shape (B, block_length, V), so a row's draws depend only on its batch index.
    """
    validate_sampler_args(gen_length, block_length, steps, temperature, remasking, cfg_scale, mask_token_id)
    _validate_prompt(prompt_ids, prompt_mask, mask_token_id)
    eos_token_ids = _normalise_eos_ids(eos_token_ids)
    needs_random = temperature > 0 or remasking == "random"
    if needs_random and generator is None:
        raise ValueError(
            f"generator is None but temperature={temperature} / remasking={remasking!r} needs random numbers; pass "
            "generator=torch.Generator(device=...).manual_seed(seed) (the global RNG is never used)."
        )

    batch_size, prompt_length = prompt_ids.shape
    device = prompt_ids.device
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks

    x = torch.full((batch_size, prompt_length + gen_length), mask_token_id, dtype=torch.long, device=device)  # (B, L)
    x[:, :prompt_length] = prompt_ids
    attention_mask = None
    if prompt_mask is not None:
        completion_ones = torch.ones(batch_size, gen_length, dtype=prompt_mask.dtype, device=device)  # (B, G)
        attention_mask = torch.cat([prompt_mask, completion_ones], dim=1)  # (B, L)
    if cfg_scale > 0:
        # Unconditional pass: real prompt tokens become mask tokens; pad positions stay pads (masked from attention).
        prompt_real = torch.ones_like(prompt_ids, dtype=torch.bool) if prompt_mask is None else prompt_mask.bool()
        uncond_prompt = torch.where(prompt_real, torch.full_like(prompt_ids, mask_token_id), prompt_ids)  # (B, P)
        model_mask = None if attention_mask is None else torch.cat([attention_mask, attention_mask], dim=0)  # (2B, L)
    else:
        model_mask = attention_mask

    for block in range(num_blocks):
        start = prompt_length + block * block_length
        end = start + block_length
        block_masked = x[:, start:end] == mask_token_id  # (B, block)
        reveal_counts = uniform_reveal_schedule(block_masked.sum(dim=1), steps_per_block)  # (B, steps_per_block)

        for step in range(steps_per_block):
            if cfg_scale > 0:
                x_uncond = torch.cat([uncond_prompt, x[:, prompt_length:]], dim=1)  # (B, L)
                logits = logits_fn(torch.cat([x, x_uncond], dim=0), model_mask)  # (2B, L, V)
                _check_logits(logits, 2 * batch_size, x.shape[1], mask_token_id)
                compute_dtype = torch.promote_types(logits.dtype, torch.float32)
                cond = logits[:batch_size, start:end].to(compute_dtype)  # (B, block, V)
                uncond = logits[batch_size:, start:end].to(compute_dtype)  # (B, block, V)
                block_logits = uncond + (cfg_scale + 1) * (cond - uncond)  # (B, block, V)
            else:
                logits = logits_fn(x, model_mask)  # (B, L, V)
                _check_logits(logits, batch_size, x.shape[1], mask_token_id)
                compute_dtype = torch.promote_types(logits.dtype, torch.float32)
                # A copy: the -inf below must not write into the caller's logits.
                block_logits = logits[:, start:end].to(compute_dtype, copy=True)  # (B, block, V)
            del logits
            block_logits[..., mask_token_id] = -torch.inf  # the mask token is never a candidate

            if generator is not None and generator.device.type != block_logits.device.type:
                raise ValueError(
                    f"generator is on device {generator.device} but the logits are on {block_logits.device}; "
                    f"create it with torch.Generator(device={str(block_logits.device)!r})."
                )
            candidates = _draw_candidates(block_logits, temperature, generator)  # (B, block)
            if remasking == "low_confidence":
                probs = torch.softmax(block_logits, dim=-1)  # (B, block, V)
                confidence = torch.gather(probs, -1, candidates[..., None]).squeeze(-1)  # (B, block)
                del probs
            else:
                confidence = torch.rand(
                    candidates.shape, generator=generator, dtype=torch.float64, device=candidates.device
                )  # (B, block)

            current = x[:, start:end]  # (B, block)
            still_masked = current == mask_token_id  # (B, block)
            confidence = torch.where(still_masked, confidence.double(), -torch.inf)  # (B, block)
            reveal = _top_k_mask(confidence, reveal_counts[:, step])  # (B, block) bool
            x[:, start:end] = torch.where(reveal, candidates, current)

    completion_ids = x[:, prompt_length:].clone()  # (B, G)
    return SamplerOutput(
        completion_ids=completion_ids,
        completion_mask=completion_mask_from_ids(completion_ids, eos_token_ids),
    )


def _check_logits(logits, expected_rows: int, expected_length: int, mask_token_id: int) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits)
        raise ValueError(f"logits_fn must return a (batch, length, vocab) tensor, got {shape!r}.")
    if logits.shape[0] != expected_rows or logits.shape[1] != expected_length:
        raise ValueError(
            f"logits_fn returned logits of shape {tuple(logits.shape)} for input of shape "
            f"({expected_rows}, {expected_length}); it must return one logit vector per input position."
        )
    if mask_token_id >= logits.shape[2]:
        raise ValueError(
            f"mask_token_id={mask_token_id} is outside the model's vocabulary of {logits.shape[2]} logits; pass the "
            "model's own mask token id."
        )


def _draw_candidates(block_logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """Argmax at temperature 0, else Gumbel-max: a sample from softmax(logits / temperature).

    The noise is float64 (as in LLaDA): float32 uniforms cap the Gumbel noise near 16.6 and cut the tail.
    """
    if temperature == 0:
        return block_logits.argmax(dim=-1)  # (B, block)
    uniform = torch.rand(
        block_logits.shape, generator=generator, dtype=torch.float64, device=block_logits.device
    )  # (B, block, V)
    # log of LLaDA's exp(logits) / (-log u)^T: same argmax, no overflow.
    scores = block_logits.double() - temperature * torch.log(-torch.log(uniform))  # (B, block, V)
    return scores.argmax(dim=-1)  # (B, block)


def _top_k_mask(confidence: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Boolean mask of each row's k[row] highest-confidence positions. confidence (B, N), k (B,)."""
    max_k = int(k.max())
    selected = torch.zeros_like(confidence, dtype=torch.bool)  # (B, N)
    if max_k == 0:
        return selected
    top_index = torch.topk(confidence, k=max_k, dim=1).indices  # (B, max_k)
    keep = torch.arange(max_k, device=confidence.device)[None, :] < k[:, None]  # (B, max_k)
    selected.scatter_(1, top_index, keep)
    return selected
