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
from transformers import DynamicCache


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


def check_no_cache(cache, model_name: str, allow_canvas_cache: bool = False) -> None:
    """A key/value cache assumes causal attention (earlier keys never change); a bidirectional model has none.

    `allow_canvas_cache`: accept a `CanvasCache` (the approximate, opt-in cache of Fast-dLLM-style rollouts).
    """
    if allow_canvas_cache and isinstance(cache, CanvasCache):
        return
    if cache is not None:
        raise ValueError(
            f"{model_name} attends bidirectionally, so it cannot reuse a key/value cache (got cache={type(cache).__name__}); "
            "call it without `cache` / `past_key_values`."
        )


class CanvasCache(DynamicCache):
    """Approximate key/value cache for a bidirectional model decoding a fixed canvas (Fast-dLLM's prefix / dual cache).

    With bidirectional attention no cache is exact: every key depends on every position, so keys computed before a
    token was revealed are stale afterwards. Fast-dLLM (arXiv 2505.22618) reuses them anyway, refreshing them once per
    block. This cache has two phases:
    - recording (`window_start is None`): a forward over the whole canvas (B, L) stores every layer's keys and values,
      exactly as `DynamicCache`;
    - windowed (`window_start = s`): a forward over the n positions [s, s + n) only. Each layer writes the window's
      fresh keys and values over the recorded ones in place and attends over all L positions: positions outside the
      window use the keys recorded at the last full forward. The stored length never grows.
    Prefix cache: window [block start, L) (the block and the masked suffix are recomputed, the prefix is reused).
    Dual cache: window [block start, block end) (the masked suffix is reused too).
    `keep_rows(index)` drops rows (finished rows leaving the batch).
    """

    def __init__(self):
        super().__init__()
        self.window_start: int | None = None

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.window_start is None:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        layer = self.layers[layer_idx]
        start, end = self.window_start, self.window_start + key_states.shape[-2]
        if end > layer.keys.shape[-2] or key_states.shape[0] != layer.keys.shape[0]:
            raise ValueError(
                f"CanvasCache window [{start}, {end}) x {key_states.shape[0]} rows does not fit the recorded canvas of "
                f"{layer.keys.shape[-2]} positions x {layer.keys.shape[0]} rows; record a full forward first."
            )
        layer.keys[..., start:end, :] = key_states  # (B, H_kv, n, Dh) into (B, H_kv, L, Dh)
        layer.values[..., start:end, :] = value_states
        return layer.keys, layer.values

    @property
    def canvas_length(self) -> int:
        return self.get_seq_length()

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep only the rows `index` (1-D long) of every layer."""
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys = layer.keys.index_select(0, index)
                layer.values = layer.values.index_select(0, index)
