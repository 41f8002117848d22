"""The native model configs (LLaDA, LLaDA2, SDAR, Dream) refuse out-of-range values at construction, naming the model
and the field, instead of crawling (a block above the positions), giving NaN logits (zero expert width,
non-positive rope_theta or routed scaling) or ending in a bare ZeroDivisionError (zero KV heads)."""

import math

import pytest

from stabledrl_trl.models.dream import DreamConfig
from stabledrl_trl.models.llada import LLaDAConfig
from stabledrl_trl.models.llada2 import LLaDA2MoeConfig
from stabledrl_trl.models.sdar import SDARConfig
from stabledrl_trl.tiny import tiny_llada2_config_dict, tiny_llada_config_dict, tiny_sdar_config_dict


def dream_dict(**overrides):
    config = {"vocab_size": 120, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
              "rope_theta": 1e6, "mask_token_id": 110, "bos_token_id": 100, "eos_token_id": 100, "pad_token_id": 100,
              "use_sliding_window": False}  # fmt: skip
    config.update(overrides)
    return config


def build(family, **overrides):
    if family == "llada":
        return LLaDAConfig(**tiny_llada_config_dict(**overrides))
    if family == "llada2":
        return LLaDA2MoeConfig(**{k: v for k, v in tiny_llada2_config_dict(**overrides).items() if k != "model_type"})
    if family == "sdar":
        return SDARConfig(**{k: v for k, v in tiny_sdar_config_dict(**overrides).items() if k != "model_type"})
    return DreamConfig(**dream_dict(**overrides))


@pytest.mark.parametrize("family", ["llada", "llada2", "sdar", "dream"])
def test_the_tiny_configs_pass(family):
    build(family)


LLADA2_CASES = [
    ({"block_size": 1024}, "block_size=1024 is larger than max_position_embeddings=512"),
    ({"moe_intermediate_size": 0}, "moe_intermediate_size=0 must be a positive integer"),
    ({"rope_theta": 0.0}, "rope_theta=0.0 must be a finite number > 0"),
    ({"rope_theta": -5.0}, "rope_theta=-5.0 must be a finite number > 0"),
    ({"routed_scaling_factor": 0.0}, "routed_scaling_factor=0.0 must be a finite number > 0"),
    ({"routed_scaling_factor": math.nan}, "routed_scaling_factor=nan must be a finite number > 0"),
    ({"num_shared_experts": -1}, "num_shared_experts=-1 must be an integer >= 0"),
    ({"num_key_value_heads": 0}, "num_key_value_heads=0 must be a positive integer"),
    ({"num_attention_heads": 0, "head_dim": None}, "num_attention_heads=0 must be a positive integer"),
    ({"eos_token_id": 101}, "eos_token_id=101 must be a token id in the vocabulary [0, vocab_size=101)"),
    ({"pad_token_id": -1}, "pad_token_id=-1 must be a token id"),
    ({"eos_token_id": [0, 500]}, "eos_token_id=[0, 500] must be a token id"),
    ({"rms_norm_eps": 0.0}, "rms_norm_eps=0.0 must be a finite number > 0"),
    ({"first_k_dense_replace": 7}, "first_k_dense_replace=7 exceeds num_hidden_layers=3"),
    ({"attention_dropout": 1.0}, "attention_dropout=1.0 must be a probability in [0, 1)"),
]


@pytest.mark.parametrize("overrides, message", LLADA2_CASES)
def test_llada2_config_values_are_checked_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=r"^LLaDA2 config " + _escape(message)):
        build("llada2", **overrides)


@pytest.mark.parametrize(
    "family, overrides, message",
    [
        (
            "llada",
            {"n_kv_heads": 0},
            "num_key_value_heads (n_kv_heads in its config.json)=0 must be a positive integer",
        ),
        ("llada", {"n_heads": 0}, "num_attention_heads (n_heads in its config.json)=0 must be a positive integer"),
        ("llada", {"rope_theta": -1.0}, "rope_theta=-1.0 must be a finite number > 0"),
        ("llada", {"eos_token_id": 126081}, "eos_token_id=126081 must be a token id"),
        ("llada", {"d_model": 0}, "hidden_size (d_model in its config.json)=0 must be a positive integer"),
        ("sdar", {"block_size": 4096}, "block_size=4096 is larger than max_position_embeddings"),
        ("sdar", {"num_key_value_heads": 0}, "num_key_value_heads=0 must be a positive integer"),
        ("sdar", {"rope_theta": math.inf}, "rope_theta=inf must be a finite number > 0"),
        ("sdar", {"pad_token_id": 1000}, "pad_token_id=1000 must be a token id"),
        ("dream", {"num_key_value_heads": 0}, "num_key_value_heads=0 must be a positive integer"),
        ("dream", {"rope_theta": 0}, "rope_theta=0 must be a finite number > 0"),
        ("dream", {"bos_token_id": 120}, "bos_token_id=120 must be a token id"),
        ("dream", {"num_hidden_layers": 0}, "num_hidden_layers=0 must be a positive integer"),
    ],
)
def test_other_native_configs_check_their_values(family, overrides, message):
    with pytest.raises(ValueError, match=_escape(message)):
        build(family, **overrides)


def _escape(text: str) -> str:
    import re

    return re.escape(text)
