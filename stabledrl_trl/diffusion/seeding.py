"""Layout-independent per-row seeds for likelihood-estimator masks.

The trainer derives each row's mask seed from the row's own tokens (prompt and completion, padding excluded) mixed
with a base seed and a stream id (old policy, inner iteration, training step). A row therefore gets the same masks
whichever micro-batch, accumulation step or process holds it and however much padding surrounds it, which is what
makes group-exact normalisation reproducible across layouts and resumed runs exact.

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
