"""Block-causal attention of the block diffusion LMs (SDAR / TraDo, LLaDA2): the masks and the positions.

A block diffusion LM denoises a block of `block_size` positions while attending to every earlier (clean) block:

    block(p) = p // block_size           (blocks aligned at absolute position 0)
    query at position p_q sees key at p_k  iff  key is real and block(p_k) <= block(p_q)

i.e. causal across blocks, bidirectional inside a block. Positions count real tokens only (`cumsum(mask) - 1`), so
blocks are aligned on a row's real tokens and a left-padded row gives exactly the logits of the row alone. With a
key/value cache of earlier blocks the queries are the new tokens and the keys the cached ones plus the new ones; the
cache is exact because block-causality never lets an earlier block see a later one.

`block_causal_inputs` turns the 2-D (or absent) attention mask of a forward call into the new tokens' positions and
this mask; `two_copy_block_mask` is BD3-LM's training mask for the [noisy copy || clean copy] layout.
"""

from __future__ import annotations

import torch

from .bidirectional import padding_position_ids

SUPPORTED_ATTENTION = ("sdpa", "eager")


def check_attention_implementation(config, model_name: str) -> str:
    """The configured attention kernel ("sdpa" when unset); a ValueError unless the block-causal mask runs on it."""
    implementation = config._attn_implementation or "sdpa"
    if implementation not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"{model_name}'s block-causal mask runs on {SUPPORTED_ATTENTION} attention, got attn_implementation="
            f"{implementation!r}; load the model with attn_implementation='sdpa'."
        )
    return implementation


def block_causal_mask(
    query_positions: torch.Tensor, key_positions: torch.Tensor, key_real: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Block-causal attention: query at position p sees real keys whose block p_k // bs is at most p // bs.

    query_positions (B, Q), key_positions (B, K), key_real (B, K) bool. Returns (B, 1, Q, K) bool, True = attend.
    A query with no visible key (a padding query whose row has no real token in its block) sees its own column
    when it is one of the keys, so no softmax row is empty; it is never a real query.
    """
    q_block = torch.div(query_positions, block_size, rounding_mode="floor")[:, :, None]  # (B, Q, 1)
    k_block = torch.div(key_positions, block_size, rounding_mode="floor")[:, None, :]  # (B, 1, K)
    mask = (k_block <= q_block) & key_real[:, None, :]  # (B, Q, K)
    Q, K = mask.shape[1:]
    empty = ~mask.any(-1, keepdim=True)  # (B, Q, 1)
    if bool(empty.any()):
        own = torch.zeros(Q, K, dtype=torch.bool, device=mask.device)
        own[:, K - Q :] = torch.eye(Q, dtype=torch.bool, device=mask.device)  # the new tokens are the last Q keys
        mask = mask | (empty & own)
    return mask[:, None]  # (B, 1, Q, K)


def block_causal_inputs(
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    batch: int,
    length: int,
    past: int,
    device: torch.device,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (B, L) of the `length` new tokens and their block-causal mask (B, 1, L, past + L) over the keys.

    attention_mask: None (every token real, positions 0..past+L-1) or 2-D (B, past + L) over the cached and the new
    columns, 1 = real (padding hidden, positions from its cumsum). position_ids (B or 1, L), optional, overrides the
    new tokens' positions (the cached keys keep theirs).
    """
    B, L = batch, length
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape != (B, past + L):
            raise ValueError(
                f"attention_mask must be 2-D (batch, cached + new) = ({B}, {past + L}) or a 4-D mask (batch, 1, {L}, "
                f"{past + L}), got shape {tuple(attention_mask.shape)}."
            )
        key_real = attention_mask.bool().to(device)  # (B, past + L)
        key_positions = padding_position_ids(key_real).to(device)  # (B, past + L)
    else:
        key_real = torch.ones(B, past + L, dtype=torch.bool, device=device)
        key_positions = torch.arange(past + L, device=device)[None].expand(B, -1)
    if position_ids is None:
        position_ids = key_positions[:, past:]
    else:
        position_ids = position_ids.to(device).expand(B, L)
        key_positions = torch.cat([key_positions[:, :past], position_ids], dim=1)
    return position_ids, block_causal_mask(position_ids, key_positions, key_real, block_size)


def two_copy_block_mask(positions: torch.Tensor, real: torch.Tensor, block_size: int) -> torch.Tensor:
    """BD3-LM's mask for the 2n layout [noisy copy || clean copy] (same positions in both copies).

    positions (B, L), real (B, L) bool for one copy. Returns (B, 1, 2L, 2L) bool, True = attend:
    - a noisy query sees the noisy keys of its own block and the clean keys of strictly earlier blocks;
    - a clean query sees the clean keys of its own and earlier blocks (block-causal, as at inference), never a
      noisy key.
    So the noisy copy's logits of block b are the model's denoising prediction of block b given the clean history:
    every block's denoising term in one forward (arXiv 2503.09573, Sec. 3.2; SDAR's training layout).
    A padding query with no visible key sees itself, so no softmax row is empty.
    """
    blk = torch.div(positions, block_size, rounding_mode="floor")  # (B, L)
    q, k = blk[:, :, None], blk[:, None, :]  # (B, L, 1), (B, 1, L)
    keys = real[:, None, :]  # (B, 1, L)
    noisy_noisy = (k == q) & keys
    noisy_clean = (k < q) & keys
    clean_clean = (k <= q) & keys
    top = torch.cat([noisy_noisy, noisy_clean], dim=-1)  # (B, L, 2L)
    bottom = torch.cat([torch.zeros_like(clean_clean), clean_clean], dim=-1)
    mask = torch.cat([top, bottom], dim=1)  # (B, 2L, 2L)
    empty = ~mask.any(-1, keepdim=True)
    if bool(empty.any()):
        eye = torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device)
        mask = mask | (empty & eye)
    return mask[:, None]
