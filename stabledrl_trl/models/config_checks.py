"""Value checks shared by the native model configs (LLaDA, LLaDA2, SDAR, Dream), run when a config is built.

A config value out of its range does not always fail where it is used: a block size above the model's positions
makes every rollout crawl (one RL step took minutes instead of a second), a zero expert width or a non-positive
`rope_theta` gives NaN logits, a token id outside the vocabulary indexes past the embedding only when that token
appears, and zero KV heads or negative shared experts end in a bare ZeroDivisionError or a torch error. Each of
these is an error here, at construction, naming the model, the field, its value and the valid range.

`check_native_config` checks the fields a config has (a missing one is not an error: each family has its own):
sizes are positive integers, counts non-negative integers, scales finite and positive, dropouts in [0, 1), token
ids inside [0, vocab_size), and `block_size` at most `max_position_embeddings`.
"""

from __future__ import annotations

import functools
import math

# sizes: integers >= 1
POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "block_size",
    "num_experts",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "moe_intermediate_size",
)
# counts: integers >= 0
NON_NEGATIVE_INTS = ("num_shared_experts", "first_k_dense_replace")
# finite numbers > 0
POSITIVE_FLOATS = ("rope_theta", "rms_norm_eps", "routed_scaling_factor")
# probabilities of dropping: [0, 1)
DROPOUTS = ("attention_dropout", "embedding_dropout", "output_dropout", "hidden_dropout", "residual_dropout")
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "mask_token_id")


def _fail(model: str, name: str, value, need: str, aliases: dict | None = None) -> None:
    shown = f"{name} ({aliases[name]} in its config.json)" if aliases and name in aliases else name
    raise ValueError(
        f"{model} config {shown}={value!r} {need}; fix the model's config.json (or the config you built)."
    )


def _rope_theta(config):
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        rope = getattr(config, "rope_parameters", None)
        if isinstance(rope, dict):
            theta = rope.get("rope_theta")
    return theta


def check_native_config(config, model: str, *, sizes_only: bool = False, aliases: dict | None = None) -> None:
    """Raise ValueError naming `model`, the field and its value for the first out-of-range value (module docstring).

    sizes_only: check the integer sizes and counts only (a config calls this before its parent derives values from
    them, e.g. head_dim = hidden_size // num_attention_heads, which would raise a bare ZeroDivisionError).
    aliases: {field: the key the model's own config.json uses for it} (LLaDA's d_model, ...), named in the message."""
    fail = functools.partial(_fail, aliases=aliases)
    for name in POSITIVE_INTS:
        value = getattr(config, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            fail(model, name, value, "must be a positive integer")
    for name in NON_NEGATIVE_INTS:
        value = getattr(config, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            fail(model, name, value, "must be an integer >= 0")
    if sizes_only:
        return
    for name in POSITIVE_FLOATS:
        value = _rope_theta(config) if name == "rope_theta" else getattr(config, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            fail(model, name, value, "must be a finite number > 0")
    for name in DROPOUTS:
        value = getattr(config, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            fail(model, name, value, "must be a probability in [0, 1)")
    factor = getattr(config, "partial_rotary_factor", None)
    if factor is not None and (
        isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1
    ):
        fail(model, "partial_rotary_factor", factor, "must be in (0, 1]")
    vocab = getattr(config, "vocab_size", None)
    for name in TOKEN_IDS:
        value = getattr(config, name, None)
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if token is None:
                continue
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                fail(model, name, value, f"must be a token id in the vocabulary [0, vocab_size={vocab})")
    block, positions = getattr(config, "block_size", None), getattr(config, "max_position_embeddings", None)
    if block is not None and positions is not None and block > positions:
        fail(model, "block_size", block, f"is larger than max_position_embeddings={positions} (one block must fit)")
    layers, dense = getattr(config, "num_hidden_layers", None), getattr(config, "first_k_dense_replace", None)
    if layers is not None and dense is not None and dense > layers:
        fail(model, "first_k_dense_replace", dense, f"exceeds num_hidden_layers={layers}")
