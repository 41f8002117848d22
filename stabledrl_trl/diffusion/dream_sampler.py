"""Dream's masked-diffusion sampler (Dream-v0, DiffuCoder): one global schedule, no blocks, confidence-ranked reveals.

The completion starts as `gen_length` mask tokens appended after the (left-padded) prompt and is filled in `steps`
denoising steps over the whole completion at once (no semi-autoregressive blocks). With the time grid
`t = linspace(1, eps, steps + 1)` (float32), step s reveals

    k_s = floor(n_masked * (1 - t[s+1] / t[s]))     (n_masked = the row's masked positions before the step)

positions, and every position still masked at the last step. At each step the model predicts all positions; for
each masked position a candidate token and a confidence come from the softmax over the WHOLE vocabulary (the mask
token included, as Dream computes it) after temperature, top-p and top-k, and the positions are ranked by `alg`:
- "maskgit_plus": confidence = probability of the candidate (the top probability at temperature 0);
- "topk_margin":  confidence = top-1 minus top-2 probability;
- "entropy":      confidence = sum_v p_v log(p_v + 1e-10), the negative entropy (higher = more confident); the
                  algorithm Dream's README and DiffuCoder use;
- "origin":       no ranking: each masked position is revealed with probability 1 - t[s+1] / t[s] (all of them at
                  the last step), so the number revealed per step is random.
With `alg_temp > 0` the k_s positions are drawn without replacement from softmax(confidence / alg_temp) over the
masked positions instead of taking the k_s most confident ones. Revealed tokens are never changed again.
Reference: Dream 7B (Ye et al., 2025, arXiv 2508.15487), the `diffusion_generate` of its hub code; DiffuCoder
(Gong et al., 2025, arXiv 2506.20639) uses the same sampler and ends a completion at `<|dlm_pad|>`.

The model is any `logits_fn(input_ids (B, L), attention_mask (B, L) or None) -> logits (B, L, V)` aligned with the
input positions: Dream's raw logits are shifted (output i-1 predicts token i), and
`stabledrl_trl.diffusion.adapter.DiffusionAdapter` realigns them exactly as Dream's sampler does. For a left-padded
batch the callee must hide pad keys while keeping attention bidirectional; a row then equals the row alone.

Differences from Dream's code (none changes a result at temperature 0 with float32 logits, `alg_temp = 0`):
- confidences are computed in at least float32 (Dream uses the logits' dtype, e.g. bf16, where ties are frequent);
- the reveal count uses each row's own masked count (Dream uses the batch mean, identical whenever rows agree:
  they all start with gen_length masks and reveal the same numbers);
- randomness comes only from `generator`, drawn per step on the fixed (B, gen_length) completion grid, so a row's
  draws depend on its batch index (and the batch size) only, not on the other rows' contents or on padding:
  candidate tokens by inverse-CDF sampling in float64 with one uniform per position (Dream:
  `torch.distributions.Categorical`), alg_temp positions by Gumbel-top-k (the same law as Dream's
  `torch.multinomial` without replacement, and still defined where the float32 softmax underflows), origin's
  reveal decisions with one uniform per position (Dream: `torch.rand`);
- a candidate equal to the mask token leaves its position masked (as in Dream: a trained Dream gives the mask token a
  negligible probability), except at the last step, where the mask token is not a candidate, so the completion never
  holds a mask token (Dream would return one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ..checks import _is_int, _is_number
from .llada_sampler import SamplerOutput, completion_mask_from_ids

LogitsFn = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]

DREAM_ALGORITHMS = ("maskgit_plus", "topk_margin", "entropy", "origin")
ENTROPY_EPS = 1e-10  # Dream's log(p + 1e-10)
CHUNK_ELEMENTS = 1 << 28  # positions x vocabulary per working tensor of a step (1 GiB in float32)


@dataclass
class DreamSamplerOutput(SamplerOutput):
    """`SamplerOutput` plus, with `return_history=True`, the canvas after each step (Dream's output_history)."""

    history: torch.Tensor | None = None  # (steps, B, gen_length) long


def _eos_tuple(eos_token_ids) -> tuple[int, ...]:
    ids = () if eos_token_ids is None else (eos_token_ids,) if _is_int(eos_token_ids) else tuple(eos_token_ids)
    if not all(_is_int(i) for i in ids):
        raise ValueError(f"eos_token_ids must be an int or a sequence of ints, got {eos_token_ids!r}.")
    return ids


def _check_prompt(prompt_ids, prompt_mask, mask_token_id: int) -> None:
    """(B, P) long prompts, an optional left-padding 0/1 mask of the same shape, no mask token in real positions."""
    if not isinstance(prompt_ids, torch.Tensor) or prompt_ids.dim() != 2 or prompt_ids.dtype != torch.long:
        desc = f"{tuple(prompt_ids.shape)} {prompt_ids.dtype}" if isinstance(prompt_ids, torch.Tensor) else prompt_ids
        raise ValueError(f"prompt_ids must be a (batch, prompt_length) torch.long tensor, got {desc!r}.")
    if prompt_ids.shape[0] == 0:
        raise ValueError("prompt_ids has an empty batch dimension; pass at least one prompt.")
    real = torch.ones_like(prompt_ids, dtype=torch.bool)
    if prompt_mask is not None:
        if not isinstance(prompt_mask, torch.Tensor) or prompt_mask.shape != prompt_ids.shape:
            shape = tuple(prompt_mask.shape) if isinstance(prompt_mask, torch.Tensor) else prompt_mask
            raise ValueError(f"prompt_mask must have prompt_ids' shape {tuple(prompt_ids.shape)}, got {shape!r}.")
        if not bool(((prompt_mask == 0) | (prompt_mask == 1)).all()):
            raise ValueError("prompt_mask must hold only 0 (padding) and 1 (prompt token).")
        if bool((prompt_mask[:, 1:] < prompt_mask[:, :-1]).any()):
            raise ValueError(
                "prompt_mask is not left-padded (a 0 follows a 1 in some row); the completion is appended after the "
                "last column, so pad prompts on the left (tokenizer.padding_side = 'left')."
            )
        real = prompt_mask.bool()
    if bool(((prompt_ids == mask_token_id) & real).any()):
        raise ValueError(
            f"prompt_ids contains mask_token_id={mask_token_id} at real prompt positions; the sampler only fills the "
            "completion. Remove mask tokens from the prompt (pass prompt_mask if the pad id equals the mask id)."
        )


def validate_dream_sampler_args(gen_length, steps, alg, alg_temp, eps, temperature, top_p, top_k) -> None:
    """Raise a ValueError naming the argument, its value and the fix for any invalid Dream sampler setting."""
    if not _is_int(gen_length) or gen_length < 1:
        raise ValueError(f"gen_length must be a positive integer, got {gen_length!r}.")
    if not _is_int(steps) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r} (Dream uses steps = gen_length).")
    if alg not in DREAM_ALGORITHMS:
        raise ValueError(f"alg must be one of {DREAM_ALGORITHMS}, got {alg!r} (Dream's README uses 'entropy').")
    if not _is_number(alg_temp) or not math.isfinite(alg_temp) or alg_temp < 0:
        raise ValueError(f"alg_temp must be a finite number >= 0 (0 = take the most confident), got {alg_temp!r}.")
    if alg == "origin" and alg_temp > 0:
        raise ValueError(
            f"alg_temp={alg_temp} has no effect with alg='origin' (positions are revealed at random, not ranked); "
            "set alg_temp=0 or choose a ranking alg ('entropy', 'maskgit_plus', 'topk_margin')."
        )
    if not _is_number(eps) or not 0 <= eps < 1:
        raise ValueError(
            f"eps must be a number in [0, 1) (the final time of the schedule; Dream uses 1e-3), got {eps!r}."
        )
    if not _is_number(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}.")
    if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1] (1 = no nucleus filtering), got {top_p!r}.")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be None (no filtering) or a positive integer, got {top_k!r}.")


def dream_timesteps(steps: int, eps: float, device=None) -> torch.Tensor:
    """Dream's time grid `linspace(1, eps, steps + 1)` in float32, (steps + 1,)."""
    return torch.linspace(1, eps, steps + 1, device=device)


def dream_reveal_count(num_masked: torch.Tensor, step: int, timesteps: torch.Tensor) -> torch.Tensor:
    """Positions to reveal at `step`: floor(n * (1 - t[step+1] / t[step])), or all n at the last step.

    Computed in float32 like Dream, so the floor falls exactly where Dream's does. num_masked (B,) -> (B,) long.
    Example (16 masks, eps 1e-3): steps 4 reveal [3, 4, 4, 5], steps 8 [1, 2, 2, 2, 2, 2, 2, 3].
    """
    if step == timesteps.numel() - 2:
        return num_masked.long()
    t, s = timesteps[step], timesteps[step + 1]
    return (num_masked.to(torch.float32) * (1 - s / t)).long()  # truncation = floor (non-negative)


def filter_logits(logits: torch.Tensor, temperature: float, top_p: float | None, top_k: int | None) -> torch.Tensor:
    """Dream's candidate logits: logits / temperature (if > 0), then top-p, then top-k; removed entries get the
    dtype's lowest finite value (as Dream). logits (N, V) -> (N, V).

    top-p keeps the smallest prefix of the sorted distribution whose cumulative probability exceeds top_p (the token
    crossing the threshold is kept); top-k keeps the logits >= the k-th largest.
    """
    if temperature > 0:
        logits = logits / temperature
    lowest = torch.finfo(logits.dtype).min
    if top_p is not None and top_p < 1:
        sorted_logits, sorted_index = torch.sort(logits, dim=-1, descending=True)  # (N, V)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)  # (N, V)
        remove_sorted = cumulative > top_p
        remove_sorted[..., 1:] = remove_sorted[..., :-1].clone()  # keep the token that crosses top_p
        remove_sorted[..., 0] = False
        remove = torch.zeros_like(remove_sorted).scatter_(-1, sorted_index, remove_sorted)  # (N, V)
        logits = logits.masked_fill(remove, lowest)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, lowest)
    return logits


def _sample_categorical(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: the token whose cumulative-probability interval holds u * total. probs (N, V), u (N,) f64.

    Zero-probability tokens have empty intervals and are never drawn.
    """
    out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    chunk = max(1, (1 << 26) // max(1, probs.shape[-1]))  # bounds the float64 cumsum to ~0.5 GB
    for start in range(0, probs.shape[0], chunk):
        cdf = probs[start : start + chunk].double().cumsum(dim=-1)  # (n, V)
        target = (uniform[start : start + chunk] * cdf[:, -1])[:, None]  # (n, 1)
        index = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # (n,) first cdf > target
        out[start : start + chunk] = index.clamp(max=probs.shape[-1] - 1)
    return out


def dream_candidates(
    logits: torch.Tensor,
    alg: str,
    temperature: float,
    top_p: float | None,
    top_k: int | None,
    uniform: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate tokens and confidences of Dream's `sample_tokens` for N masked positions.

    logits (N, V) float; uniform (N,) float64 in [0, 1), needed when temperature > 0. Returns (confidence (N,),
    tokens (N,) long): at temperature 0 the argmax of the probabilities, else a draw from them; confidence per `alg`
    (see the module docstring; "origin" returns the maskgit_plus confidence, unused).
    """
    probs = torch.softmax(filter_logits(logits, temperature, top_p, top_k), dim=-1)  # (N, V) over the whole vocab
    if temperature > 0:
        tokens = _sample_categorical(probs, uniform)  # (N,)
        confidence = probs.gather(-1, tokens[:, None]).squeeze(-1)  # (N,)
    else:
        confidence, tokens = probs.max(dim=-1)  # (N,), (N,)
    if alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values  # (N, 2)
        confidence = top2[:, 0] - top2[:, 1]
    elif alg == "entropy":
        confidence = (probs * torch.log(probs + ENTROPY_EPS)).sum(dim=-1)  # (N,) negative entropy
    return confidence, tokens


def _ranked_reveal(confidence: torch.Tensor, k: torch.Tensor, alg_temp: float, gumbel_uniform) -> torch.Tensor:
    """Boolean (B, G) of each row's k[row] positions: the most confident, or drawn from softmax(conf / alg_temp).

    confidence (B, G) with -inf at positions that are not masked; k (B,) <= number of masked positions per row.
    """
    if alg_temp > 0:
        # Gumbel-top-k: the top k of log-weights + Gumbel noise are k draws without replacement from the weights.
        gumbel = -torch.log(-torch.log(gumbel_uniform))  # (B, G) float64
        keys = confidence.double() / alg_temp + gumbel
        confidence = torch.where(torch.isfinite(confidence), keys, -torch.inf)
    max_k = int(k.max()) if k.numel() else 0
    selected = torch.zeros_like(confidence, dtype=torch.bool)  # (B, G)
    if max_k == 0:
        return selected
    top_index = torch.topk(confidence, k=max_k, dim=1).indices  # (B, max_k)
    keep = torch.arange(max_k, device=confidence.device)[None, :] < k[:, None]  # (B, max_k)
    return selected.scatter_(1, top_index, keep)


def dream_step(
    logits: torch.Tensor,
    canvas: torch.Tensor,
    step: int,
    timesteps: torch.Tensor,
    *,
    mask_token_id: int,
    alg: str = "entropy",
    alg_temp: float = 0.0,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One denoising step of Dream's sampler on the completion canvas; returns the new canvas (B, G).

    logits: (B, G, V), aligned with the canvas positions (position i predicts token i), computed on the current
    sequence. canvas: (B, G) long, mask_token_id where still masked. timesteps: `dream_timesteps(steps, eps)`.
    Random numbers (when needed) are drawn with shape (B, G) from `generator`, in this order: token uniforms
    (temperature > 0), reveal uniforms (origin) or Gumbel uniforms (alg_temp > 0).
    """
    batch, gen = canvas.shape
    last = step == timesteps.numel() - 2
    masked = canvas == mask_token_id  # (B, G)
    draw = (
        (lambda: torch.rand(batch, gen, generator=generator, dtype=torch.float64, device=canvas.device))
        if generator is not None
        else None
    )
    token_uniform = draw()[masked] if temperature > 0 else None  # (N,)
    if alg == "origin":
        t, s = timesteps[step], timesteps[step + 1]
        p_transfer = 1.0 if last else float(1 - s / t)
        reveal = masked & (draw() < p_transfer)  # (B, G)
    else:
        reveal = None
        gumbel_uniform = draw() if alg_temp > 0 else None
    # Candidates for the N masked positions (row-major, the order of `[masked]`), in chunks of positions so that
    # each (n, V) working tensor stays within CHUNK_ELEMENTS even for a 150k vocabulary.
    rows, cols = masked.nonzero(as_tuple=True)  # (N,), (N,)
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    confidence = torch.empty(rows.numel(), dtype=compute_dtype, device=canvas.device)  # (N,)
    tokens = torch.empty(rows.numel(), dtype=torch.long, device=canvas.device)  # (N,)
    chunk = max(1, CHUNK_ELEMENTS // logits.shape[-1])
    for start in range(0, rows.numel(), chunk):
        part = slice(start, start + chunk)
        chunk_logits = logits[rows[part], cols[part]].to(compute_dtype)  # (n, V), a copy
        if last:
            chunk_logits[:, mask_token_id] = -torch.inf  # every position is filled at the last step
        uniform = None if token_uniform is None else token_uniform[part]
        confidence[part], tokens[part] = dream_candidates(chunk_logits, alg, temperature, top_p, top_k, uniform)
    candidates = torch.full_like(canvas, mask_token_id)  # (B, G)
    candidates[masked] = tokens
    if reveal is None:
        full_confidence = torch.full(canvas.shape, -torch.inf, dtype=confidence.dtype, device=canvas.device)
        full_confidence[masked] = confidence
        count = dream_reveal_count(masked.sum(dim=1), step, timesteps)  # (B,)
        reveal = _ranked_reveal(full_confidence, count, alg_temp, gumbel_uniform)
    return torch.where(reveal, candidates, canvas)


@torch.no_grad()
def generate(
    logits_fn: LogitsFn,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor | None = None,
    *,
    mask_token_id: int,
    gen_length: int = 256,
    steps: int = 256,
    alg: str = "entropy",
    alg_temp: float = 0.0,
    eps: float = 1e-3,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    eos_token_ids: Iterable[int] | int = (),
    generator: torch.Generator | None = None,
    return_history: bool = False,
) -> DreamSamplerOutput:
    """Generate `gen_length` tokens after each (left-padded) prompt with Dream's sampler (see the module docstring).

    logits_fn: `(input_ids (B, L), attention_mask (B, L) or None) -> logits (B, L, V)`, aligned (position i predicts
        token i); it receives None when `prompt_mask` is None, else the prompt mask followed by ones.
    prompt_ids: (B, P) long, left-padded. prompt_mask: (B, P) of 0/1 or None (no padding).
    alg, alg_temp, eps, temperature, top_p, top_k: as Dream's `diffusion_generate` (top_p None or 1 and top_k None
        disable filtering).
    eos_token_ids: ids that end a completion (EOS, end of turn, DiffuCoder's `<|dlm_pad|>`): the completion mask is 1
        up to and including the first of them, 0 after.
    generator: torch.Generator on the logits' device; required when temperature > 0, alg == "origin" or alg_temp > 0.
    return_history: also return `history` (steps, B, G), the canvas after each step (Dream's output_history).
    """
    validate_dream_sampler_args(gen_length, steps, alg, alg_temp, eps, temperature, top_p, top_k)
    if mask_token_id is None or not _is_int(mask_token_id) or mask_token_id < 0:
        raise ValueError(
            f"mask_token_id must be the model's mask token id (151666 for Dream-7B), got {mask_token_id!r}."
        )
    _check_prompt(prompt_ids, prompt_mask, mask_token_id)
    eos_token_ids = _eos_tuple(eos_token_ids)
    if (temperature > 0 or alg == "origin" or alg_temp > 0) and generator is None:
        raise ValueError(
            f"generator is None but temperature={temperature}, alg={alg!r}, alg_temp={alg_temp} needs random "
            "numbers; pass generator=torch.Generator(device=...).manual_seed(seed) (the global RNG is never used)."
        )
    batch_size, prompt_length = prompt_ids.shape
    device = prompt_ids.device
    if generator is not None and generator.device.type != device.type:
        raise ValueError(
            f"generator is on device {generator.device} but the prompts are on {device}; create it with "
            f"torch.Generator(device={str(device)!r})."
        )
    x = torch.full((batch_size, prompt_length + gen_length), mask_token_id, dtype=torch.long, device=device)  # (B, L)
    x[:, :prompt_length] = prompt_ids
    attention_mask = None
    if prompt_mask is not None:
        ones = torch.ones(batch_size, gen_length, dtype=prompt_mask.dtype, device=device)  # (B, G)
        attention_mask = torch.cat([prompt_mask, ones], dim=1)  # (B, L)
    timesteps = dream_timesteps(steps, eps, device=device)  # (steps + 1,)
    history = []
    for step in range(steps):
        logits = logits_fn(x, attention_mask)  # (B, L, V)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != x.shape:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits)
            raise ValueError(
                f"logits_fn must return (batch, length, vocab) logits for input of shape {tuple(x.shape)}, got {shape!r}."
            )
        if mask_token_id >= logits.shape[-1]:
            raise ValueError(
                f"mask_token_id={mask_token_id} is outside the model's vocabulary of {logits.shape[-1]} logits."
            )
        x[:, prompt_length:] = dream_step(
            logits[:, prompt_length:],
            x[:, prompt_length:],
            step,
            timesteps,
            mask_token_id=mask_token_id,
            alg=alg,
            alg_temp=alg_temp,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            generator=generator,
        )
        del logits
        if return_history:
            history.append(x[:, prompt_length:].clone())
    completion_ids = x[:, prompt_length:].clone()  # (B, G)
    return DreamSamplerOutput(
        completion_ids=completion_ids,
        completion_mask=completion_mask_from_ids(completion_ids, eos_token_ids),
        history=torch.stack(history) if return_history else None,  # (steps, B, G)
    )
