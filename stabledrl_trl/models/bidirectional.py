"""Shared pieces that turn a transformers decoder (Llama, Qwen2) into a bidirectional, padding-aware encoder.

Masked diffusion LMs (LLaDA, Dream) are decoder architectures whose attention is *not* causal: every position sees
every other real position. Two things make a transformers decoder behave that way:
- the attention modules' `is_causal` flag is False, so SDPA / flash kernels never apply their built-in causal mask
  when no explicit mask is given;
- the attention mask passed to the layers comes from `create_bidirectional_mask`: `None` when nothing is padded
  (all keys visible), otherwise a mask that hides the padded keys only.
Left padding must also not shift positions: `padding_position_ids` numbers the real tokens of each row from 0, so a
padded row sees the same rotary (or absolute) positions as the row alone.
"""

from __future__ import annotations

import torch
from torch import nn


def padding_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count real tokens only: `cumsum(mask) - 1`, clamped at 0 on the (left) padding.

    attention_mask: (B, L) with 1 for real tokens and 0 for padding. Returns (B, L) int64.
    """
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must be 2D (batch, length) to derive positions, got shape {tuple(attention_mask.shape)}"
        )
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)


def disable_causal_attention(model: nn.Module) -> None:
    """Set `is_causal = False` on every attention module of `model` (the flag SDPA and flash attention read)."""
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False


def check_no_cache(cache, model_name: str) -> None:
    """A key/value cache assumes causal attention (earlier keys never change); a bidirectional model has none."""
    if cache is not None:
        raise ValueError(
            f"{model_name} attends bidirectionally, so it cannot reuse a key/value cache (got cache={type(cache).__name__}); "
            "call it without `cache` / `past_key_values`."
        )
