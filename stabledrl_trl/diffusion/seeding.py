"""Layout-independent per-row seeds for likelihood-estimator masks.

The trainer keys each row by its position in the run's global stream of rollouts (`rollout_row_keys`: generation
batch after generation batch, process after process, in the order TRL's sampler draws the prompts) and mixes that
key with the config seed and a stream id (old policy, inner iteration, training step). Every row therefore draws its
masks independently of every other row, identical completions of a group included (as the official StableDRL code
does), and a row gets the same masks whichever micro-batch, accumulation step or process holds it and however much
padding surrounds it: group-exact normalisation is reproducible across layouts, and resumed runs are exact.

`row_seeds` keys a row by its tokens instead (two rows with the same tokens get the same masks); scripts that score
a fixed set of rollouts use it.

All arithmetic is int64 on values below 2^48 (see `masking.mix32`), so it is identical on every device.
"""

from __future__ import annotations

import torch

from .masking import _mul32, mix32

_M32 = 0xFFFFFFFF


def content_keys(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A 32-bit key per row from its unmasked tokens, in order; padding (mask == 0) is skipped.

    ids, mask: (B, L). Returns (B,) int64. Two rows with the same real tokens get the same key, wherever the padding.
    """
    ids = ids.long()
    keep = mask.bool()
    rank = keep.long().cumsum(-1)  # (B, L) 1-based index of each real token among the real tokens
    # hash each (token, rank) pair, then combine by a wrapping sum (order enters through the rank)
    h = mix32(mix32((ids + 0x9E3779B9) & _M32) ^ _mul32(rank & _M32, 0x85EBCA6B))  # (B, L)
    h = torch.where(keep, h, torch.zeros_like(h))
    total = h.sum(-1) & _M32  # (B,)
    return mix32(total ^ _mul32(keep.sum(-1) & _M32, 0xC2B2AE35))


def mix_seed(keys: torch.Tensor, *stream: int) -> torch.Tensor:
    """Combine per-row keys (B,) with integers (base seed, stream ids) into per-row seeds (B,) int64 in [0, 2^31)."""
    x = keys.long() & _M32
    for s in stream:
        x = mix32(x ^ mix32(torch.full_like(x, (int(s) + 0x27D4EB2F) & _M32)))
    return x & 0x7FFFFFFF


def row_seeds(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *stream: int,
) -> torch.Tensor:
    """Per-row mask seeds from the row's real prompt and completion tokens and a stream (B,) int64."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + C)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (B, P + C)
    return mix_seed(content_keys(ids, mask), *stream)


def rollout_row_keys(first_row: int, num_rows: int, *stream: int, device=None) -> torch.Tensor:
    """Keys (num_rows,) int64 of the rows first_row, first_row + 1, ... of a run's global stream of rollouts.

    A process holding rows [p * n, (p + 1) * n) of generation batch g (N processes, n rows each) passes
    first_row = (g * N + p) * n: the same row gets the same key under any number of processes or micro-batches.
    `stream` separates independent row streams (e.g. training and evaluation rollouts). Mix the keys with the seed
    and the mask stream with `mix_seed` to get per-row mask seeds.
    """
    if first_row < 0 or num_rows < 0:
        raise ValueError(f"first_row and num_rows must be non-negative, got {first_row} and {num_rows}")
    rows = torch.arange(first_row, first_row + num_rows, dtype=torch.long, device=device)  # (num_rows,)
    return mix_seed(rows, *stream)
