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

Differences from LLaDA's reference code (the first three leave the result unchanged):
- logits, candidates, noise and confidences are computed for the current block's positions only, (B, block_length,
  V) instead of (B, L, V): LLaDA gives every position outside the block -inf confidence anyway (earlier blocks are
  fully revealed, later ones are excluded), so those candidates are never used. A logits_fn that accepts
  `logits_to_keep` (a `DiffusionAdapter`) runs its output head on the block's positions only;
- with `eos_token_ids`, a row whose completed blocks contain an EOS token leaves the batch, and decoding stops when
  every row has: later blocks never change earlier tokens, so the completion up to its first EOS is the same;
- Gumbel-max in log space, argmax(logits - T * log(-log u)) in float64, the same argmax as LLaDA's
  exp(logits) / (-log u)^T without its overflow for large logits or temperatures;
- the mask token is never a candidate (its logit is set to -inf): a "revealed" mask token would leave the
  position masked behind the block. A trained LLaDA gives the mask token a negligible probability, so this only
  matters for untrained models;
- guidance and confidences are computed in at least float32 (LLaDA uses the model's dtype: bf16 probabilities tie
  often, and ties make the reveal order arbitrary);
- randomness comes only from the `generator` argument, through one generator per row seeded from it; random
  remasking scores are float64 (ties practically impossible) and, like the Gumbel noise, drawn for the current block
  only, so a row's draws depend only on its batch index, not on the prompt lengths or on which rows remain.

Approximate modes (opt-in, `cache=`, `threshold=`): Fast-dLLM's prefix / dual key-value cache (arXiv 2505.22618) on a
`CanvasCache` and confidence-threshold parallel decoding; see `generate`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from stabledrl_trl.models.bidirectional import CanvasCache

from ..checks import _is_int, _is_number
from .filtering import filter_logits, validate_filter_args

LogitsFn = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]

REMASKING_MODES = ("low_confidence", "random")


CACHE_MODES = ("none", "prefix", "dual")


@dataclass
class SamplerOutput:
    """What `generate` returns."""

    completion_ids: torch.Tensor  # (B, gen_length) long
    completion_mask: torch.Tensor  # (B, gen_length) long: 1 up to and including the first EOS token, 0 after
    forward_passes: torch.Tensor | None = None  # (B,) long: model forwards that included each row
    model_calls: int = 0  # calls of logits_fn (each over the rows still decoding)


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


def validate_fast_args(top_k, top_p, cache, threshold, max_tokens_per_step) -> None:
    """Raise a ValueError naming the argument, its value and the fix for an invalid candidate filter or fast mode."""
    validate_filter_args(top_k, top_p)
    if cache not in CACHE_MODES:
        raise ValueError(f"cache must be one of {CACHE_MODES} ('none' is exact), got {cache!r}.")
    if threshold is not None and (not _is_number(threshold) or not 0.0 < threshold < 1.0):
        raise ValueError(
            f"threshold must be a probability in (0, 1) or None (LLaDA's fixed schedule), got {threshold!r}; "
            "Fast-dLLM uses 0.9."
        )
    if max_tokens_per_step is not None:
        if not _is_int(max_tokens_per_step) or max_tokens_per_step < 1:
            raise ValueError(f"max_tokens_per_step must be a positive integer or None, got {max_tokens_per_step!r}.")
        if threshold is None:
            raise ValueError(
                f"max_tokens_per_step={max_tokens_per_step} only caps confidence-threshold decoding; set threshold "
                "(e.g. 0.9) or leave max_tokens_per_step=None."
            )


def row_generators(generator: torch.Generator, batch_size: int) -> list[torch.Generator]:
    """One generator per row, seeded by `batch_size` int64 draws from `generator` (on its device).

    Row r's random stream then depends only on `generator`'s state and r, not on which other rows are still
    decoding, so finished rows can leave the batch without changing anyone else's draws.
    """
    seeds = torch.randint(0, 2**62, (batch_size,), generator=generator, device=generator.device).tolist()
    return [torch.Generator(device=generator.device).manual_seed(int(seed)) for seed in seeds]


def _accepts_logits_to_keep(logits_fn) -> bool:
    return bool(getattr(logits_fn, "accepts_logits_to_keep", False))


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
    top_k: int | None = None,
    top_p: float | None = None,
    early_stop: bool = True,
    cache: str = "none",
    threshold: float | None = None,
    max_tokens_per_step: int | None = None,
) -> SamplerOutput:
    """Generate `gen_length` tokens after each (left-padded) prompt with LLaDA's masked-diffusion sampler.

    logits_fn: `(input_ids (B, L), attention_mask (B, L) or None) -> logits (B, L, V)`. It receives None when
        `prompt_mask` is None, else the prompt mask followed by ones for the completion; it must then mask pad
        positions out of attention (bidirectionally), or rows of a padded batch will differ from the rows alone.
        A callable with `accepts_logits_to_keep = True` (a `DiffusionAdapter`) is also called with
        `logits_to_keep=<1-D index tensor>` and returns logits (B, len(index), V) for those positions only.
    prompt_ids: (B, P) long, left-padded. prompt_mask: (B, P) of 0/1 or None (no padding).
    temperature: 0 = argmax; > 0 = sample from softmax(logits / temperature) via Gumbel-max in float64.
    remasking: "low_confidence" reveals the masked positions whose drawn token has the highest probability;
        "random" reveals uniformly random masked positions.
    cfg_scale: classifier-free guidance; > 0 adds a pass with the prompt masked and uses
        un + (cfg_scale + 1) * (cond - un).
    generator: torch.Generator on the logits' device; required when temperature > 0 or remasking == "random".
        Each row gets its own generator seeded from it (`row_generators`), and draws its noise per step with shape
        (block_length, V): a row's draws depend only on its batch index, never on the other rows.
    top_k / top_p: candidates are drawn from the `top_k` most likely tokens, then from the smallest set whose
        probability reaches `top_p` (`diffusion.filtering.filter_logits`; top_k None or 0 and top_p None or 1.0 = no
        filter). The filters restrict the draw only: the confidence stays the drawn token's probability under
        softmax(logits), as LLaDA defines it (so top_k=1 is greedy decoding).
    early_stop: with `eos_token_ids`, a row whose completed blocks contain an EOS token leaves the batch (its
        completion up to and including that EOS is final); its later positions are filled with eos_token_ids[0],
        and generation ends when every row has finished. Exact: the completion up to the first EOS, and the
        completion mask, are those of a run without early stop.

    Approximate modes (opt-in; each changes the result, see docs/rollouts.md):
    cache: "prefix" / "dual" reuse the keys and values of a full forward at each block start for the prompt and
        earlier blocks ("prefix"), and also for the masked suffix after the block ("dual"), Fast-dLLM's prefix and
        dual cache; needs a logits_fn with `supports_canvas_cache = True` (a LLaDA `DiffusionAdapter`).
    threshold: confidence-threshold parallel decoding. Each step reveals every masked position of the block whose
        confidence exceeds `threshold`, at most `max_tokens_per_step` of them (None = no cap), and never fewer than
        the uniform schedule's count, so a block still takes at most `steps // num_blocks` steps; a block whose
        positions are all revealed ends early.
    """
    validate_sampler_args(gen_length, block_length, steps, temperature, remasking, cfg_scale, mask_token_id)
    validate_fast_args(top_k, top_p, cache, threshold, max_tokens_per_step)
    _validate_prompt(prompt_ids, prompt_mask, mask_token_id)
    needs_random = temperature > 0 or remasking == "random"
    _check_call(logits_fn, prompt_ids, generator, needs_random, temperature, remasking, cache)
    eos_token_ids = _normalise_eos_ids(eos_token_ids)
    keep_fn = _accepts_logits_to_keep(logits_fn)
    batch_size, prompt_length = prompt_ids.shape
    device = prompt_ids.device
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    x, attention_mask, uncond_prompt = _initial_canvas(prompt_ids, prompt_mask, gen_length, mask_token_id, cfg_scale)
    guided = uncond_prompt is not None
    gens = row_generators(generator, batch_size) if needs_random else None
    eos = torch.tensor(eos_token_ids, dtype=torch.long, device=device) if eos_token_ids else None
    stop_rows = early_stop and eos is not None
    active = torch.arange(batch_size, device=device)  # (A,) rows still decoding
    passes = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
    calls = 0
    model_settings = dict(
        mask_token_id=mask_token_id, cfg_scale=cfg_scale if guided else None, keep_fn=keep_fn, cache=cache
    )
    step_settings = dict(
        mask_token_id=mask_token_id,
        temperature=temperature,
        remasking=remasking,
        top_k=top_k,
        top_p=top_p,
        threshold=threshold,
        max_tokens_per_step=max_tokens_per_step,
    )

    for block in range(num_blocks):
        start = prompt_length + block * block_length
        end = start + block_length
        block_masked = x[active, start:end] == mask_token_id  # (A, block)
        reveal_counts = uniform_reveal_schedule(block_masked.sum(dim=1), steps_per_block)  # (A, steps_per_block)
        ids, mask = _model_inputs(x, attention_mask, uncond_prompt, active, prompt_length)  # (R, L)
        kv_cache = None if cache == "none" else CanvasCache()
        step_settings["gens"] = [gens[i] for i in active.tolist()] if gens else None
        for step in range(steps_per_block):
            window_start = None if (kv_cache is None or step == 0) else start
            calls += 1
            passes[active] += 2 if guided else 1
            logits_args = (logits_fn, ids, mask, start, end, active.shape[0], kv_cache, window_start)
            new_block = sampling_step(
                _block_logits(*logits_args, **model_settings),
                x[active, start:end],
                reveal_counts[:, step],
                **step_settings,
            )  # (A, block); the (A, block, V) logits are freed inside the step
            x[active, start:end] = new_block
            if step + 1 < steps_per_block:
                if threshold is not None and not bool((new_block == mask_token_id).any()):
                    break  # every position of the block is revealed: the remaining steps would reveal nothing
                ids, mask = _refresh_block(ids, mask, new_block, start, end, guided)
        if stop_rows:
            finished = torch.isin(x[active, prompt_length:end], eos).any(dim=1)  # (A,)
            if bool(finished.any()):
                x[active[finished], end:] = eos_token_ids[0]
                active = active[~finished]
                if active.numel() == 0:
                    break

    completion_ids = x[:, prompt_length:].clone()  # (B, G)
    return SamplerOutput(
        completion_ids=completion_ids,
        completion_mask=completion_mask_from_ids(completion_ids, eos_token_ids),
        forward_passes=passes,
        model_calls=calls,
    )


def sampling_step(
    block_logits: torch.Tensor,
    block: torch.Tensor,
    reveal_count: torch.Tensor,
    *,
    mask_token_id: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    top_k: int | None = None,
    top_p: float | None = None,
    gens: list[torch.Generator] | None = None,
    threshold: float | None = None,
    max_tokens_per_step: int | None = None,
) -> torch.Tensor:
    """One denoising step of LLaDA's sampler on the current block (LLaDA's generate.py, one inner iteration).

        x0_i    = argmax_v (logits_iv - T log(-log u_iv))       Gumbel-max draw (argmax at T = 0), top-k / top-p
                                                                 filtered when set
        conf_i  = softmax(logits_i)[x0_i]  ("low_confidence")  or u_i ~ U(0, 1)  ("random"); -inf if i is revealed
        k       = reveal_count, raised to the number of conf_i > threshold (capped at max_tokens_per_step) when
                  `threshold` is set, at most the number of masked positions
        block_i <- x0_i for the k masked positions of highest confidence; revealed positions never change

    block_logits (A, block, V): guided logits of the block's positions in >= float32, the mask token at -inf (not
    modified). block (A, block) long: the block's current tokens. reveal_count (A,) long. gens: one generator per
    row (None when nothing is random). Returns the new block (A, block).
    """
    candidates, confidence = _candidates_and_confidence(
        block_logits, temperature, remasking, top_k, top_p, gens
    )  # (A, block) each
    del block_logits  # the (A, block, V) tensor is not needed any more
    still_masked = block == mask_token_id  # (A, block)
    confidence = torch.where(still_masked, confidence.double(), -torch.inf)  # (A, block)
    count = reveal_count  # (A,)
    if threshold is not None:
        above = (confidence > threshold).sum(dim=1)  # (A,)
        if max_tokens_per_step is not None:
            above = above.clamp(max=max_tokens_per_step)
        count = torch.maximum(count, above)
    count = torch.minimum(count, still_masked.sum(dim=1))
    reveal = _top_k_mask(confidence, count)  # (A, block) bool
    return torch.where(reveal, candidates, block)  # (A, block)


def _check_call(logits_fn, prompt_ids, generator, needs_random, temperature, remasking, cache) -> None:
    """The generator a random sampler needs, on the prompt's device; a cache only with a model that has one."""
    if needs_random and generator is None:
        raise ValueError(
            f"generator is None but temperature={temperature} / remasking={remasking!r} needs random numbers; pass "
            "generator=torch.Generator(device=...).manual_seed(seed) (the global RNG is never used)."
        )
    if generator is not None and generator.device.type != prompt_ids.device.type:
        raise ValueError(
            f"generator is on device {generator.device} but prompt_ids are on {prompt_ids.device}; create it with "
            f"torch.Generator(device={str(prompt_ids.device)!r})."
        )
    if cache != "none" and not getattr(logits_fn, "supports_canvas_cache", False):
        raise ValueError(
            f"cache={cache!r} needs a model with a key/value cache path (LLaDA through as_diffusion_lm); "
            f"{type(logits_fn).__name__} has none. Use cache='none'."
        )


def _initial_canvas(prompt_ids, prompt_mask, gen_length, mask_token_id, cfg_scale):
    """The canvas x (B, P + G): prompt then mask tokens; its attention mask (B, P + G) or None; for guidance the
    unconditional prompt (B, P): real prompt tokens become mask tokens, pads stay pads (masked from attention)."""
    batch_size, prompt_length = prompt_ids.shape
    device = prompt_ids.device
    x = torch.full((batch_size, prompt_length + gen_length), mask_token_id, dtype=torch.long, device=device)
    x[:, :prompt_length] = prompt_ids
    attention_mask = None
    if prompt_mask is not None:
        completion_ones = torch.ones(batch_size, gen_length, dtype=prompt_mask.dtype, device=device)  # (B, G)
        attention_mask = torch.cat([prompt_mask, completion_ones], dim=1)  # (B, L)
    uncond_prompt = None
    if cfg_scale > 0:
        prompt_real = torch.ones_like(prompt_ids, dtype=torch.bool) if prompt_mask is None else prompt_mask.bool()
        uncond_prompt = torch.where(prompt_real, torch.full_like(prompt_ids, mask_token_id), prompt_ids)  # (B, P)
    return x, attention_mask, uncond_prompt


def _model_inputs(x, attention_mask, uncond_prompt, rows, prompt_length):
    """(R, L) ids and mask for the active rows, doubled for guidance (conditional rows first)."""
    ids = x.index_select(0, rows)  # (A, L)
    mask = None if attention_mask is None else attention_mask.index_select(0, rows)  # (A, L)
    if uncond_prompt is None:
        return ids, mask
    uncond = torch.cat([uncond_prompt.index_select(0, rows), ids[:, prompt_length:]], dim=1)  # (A, L)
    return torch.cat([ids, uncond], dim=0), (None if mask is None else torch.cat([mask, mask], dim=0))


def _block_logits(
    logits_fn, ids, mask, start, end, rows, kv_cache, window_start, *, mask_token_id, cfg_scale, keep_fn, cache
):
    """Logits (A, block, V) at canvas positions [start, end) of the A = `rows` active rows, in >= float32, with
    guidance un + (cfg_scale + 1) (cond - un) when cfg_scale is not None, and the mask token at -inf."""
    device = ids.device
    if kv_cache is not None:
        kv_cache.window_start = window_start
        keep = torch.arange(start - (window_start or 0), end - (window_start or 0), device=device)
        inp = ids if window_start is None else ids[:, window_start:]
        if window_start is not None and cache == "dual":
            inp = ids[:, window_start:end]
        logits = logits_fn(inp, mask, logits_to_keep=keep, cache=kv_cache)  # (R, block, V)
        fresh = True
    elif keep_fn:
        keep = torch.arange(start, end, device=device)  # (block,)
        logits = logits_fn(ids, mask, logits_to_keep=keep)  # (R, block, V)
        fresh = True
    else:
        logits = logits_fn(ids, mask)  # (R, L, V)
        _check_logits(logits, ids.shape[0], ids.shape[1], mask_token_id)
        logits = logits[:, start:end]
        fresh = False
    _check_logits(logits, ids.shape[0], end - start, mask_token_id)
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    if cfg_scale is not None:
        cond, uncond = logits[:rows].to(compute_dtype), logits[rows:].to(compute_dtype)  # (A, block, V) each
        out = uncond + (cfg_scale + 1) * (cond - uncond)
    elif fresh and logits.dtype == compute_dtype:
        out = logits  # a fresh tensor the model made for this call: modified in place below
    else:
        # A copy: the -inf below must not write into the caller's logits.
        out = logits.to(compute_dtype, copy=True)
    out[..., mask_token_id] = -torch.inf  # the mask token is never a candidate
    return out


def _refresh_block(ids, mask, new_block, start, end, doubled):
    """The model inputs with the block's new tokens (both halves when guidance doubles the rows)."""
    ids = ids.clone()
    rows = new_block.shape[0]
    ids[:rows, start:end] = new_block
    if doubled:
        ids[rows:, start:end] = new_block
    return ids, mask


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


def _candidates_and_confidence(block_logits, temperature, remasking, top_k, top_p, gens):
    """Candidate tokens (A, block) and their confidences (A, block) for one step.

    block_logits (A, block, V) are not modified. gens: one generator per row (None when nothing is random).
    """
    filtered = filter_logits(block_logits, top_k, top_p)  # (A, block, V); block_logits itself when both are off
    candidates = _draw_candidates(filtered, temperature, gens)  # (A, block)
    del filtered
    if remasking == "low_confidence":
        probs = torch.softmax(block_logits, dim=-1)  # (A, block, V)
        confidence = torch.gather(probs, -1, candidates[..., None]).squeeze(-1)  # (A, block)
        del probs
    else:
        block = block_logits.shape[1]
        confidence = torch.stack(
            [torch.rand(block, generator=g, dtype=torch.float64, device=block_logits.device) for g in gens]
        )  # (A, block)
    return candidates, confidence


def _draw_candidates(block_logits: torch.Tensor, temperature: float, gens) -> torch.Tensor:
    """Argmax at temperature 0, else Gumbel-max: a sample from softmax(logits / temperature).

    The noise is float64 (as in LLaDA): float32 uniforms cap the Gumbel noise near 16.6 and cut the tail. It is drawn
    row by row from each row's own generator, (block, V) at a time, which also bounds the float64 temporaries.
    """
    if temperature == 0:
        return block_logits.argmax(dim=-1)  # (A, block)
    candidates = []
    for row, g in zip(block_logits, gens, strict=True):  # row (block, V)
        noise = torch.rand(row.shape, generator=g, dtype=torch.float64, device=row.device)  # (block, V)
        # log of LLaDA's exp(logits) / (-log u)^T: same argmax, no overflow. In place: -T log(-log u) + logits.
        noise.log_().neg_().log_().mul_(-temperature).add_(row)
        candidates.append(noise.argmax(dim=-1))  # (block,)
    return torch.stack(candidates)  # (A, block)


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
