"""Dream (Qwen2 with bidirectional attention) against a literal reference forward and Dream's own outputs (fixture),
loading, registration, and checkpoints Dream's original code loads."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file

import stabledrl_trl  # noqa: F401  (registers "Dream" with the Auto classes)
from stabledrl_trl.models.dream import DreamConfig, DreamModel

FIXTURE = Path(__file__).parent.parent / "fixtures" / "dream-tiny"  # written by Dream's original code (README)

ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def tiny_dream_config(**overrides) -> dict:
    """A Dream hub-style config.json dict for a tiny model (mask 110, EOS/pad/bos 100, GQA 4/2)."""
    config = {
        "model_type": "Dream",
        "architectures": ["DreamModel"],
        "vocab_size": 120,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 2,
        "tie_word_embeddings": False,
        "mask_token_id": 110,
        "bos_token_id": 100,
        "eos_token_id": 100,
        "pad_token_id": 100,
        "use_cache": True,
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    }
    config.update(overrides)
    return config


def build_dream(seed: int = 0, **overrides) -> DreamModel:
    """Tiny DreamModel with weights from `seed` (global RNG untouched), norms and biases randomised too."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DreamModel(DreamConfig(**tiny_dream_config(**overrides)))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
                elif name.endswith(".bias"):
                    param.copy_(0.1 * torch.randn_like(param))
                else:
                    param.copy_(0.3 * torch.randn_like(param))
    return model.eval()


def reference_forward(sd: dict, config: dict, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
    """Qwen2 with bidirectional attention in float64 on Qwen2-named weights: Dream's raw (shifted) logits."""
    d, n_heads, n_kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    hd = d // n_heads
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    w = {k: v.double() for k, v in sd.items()}
    B, L = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones(B, L, dtype=torch.long)
    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0).double()  # (B, L)
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.cat([pos[..., None] * inv_freq] * 2, dim=-1)[:, None]  # (B, 1, L, hd)
    cos, sin = angles.cos(), angles.sin()

    def rms_norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rope(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    key_bias = torch.zeros(B, 1, 1, L, dtype=torch.float64)
    key_bias[~attention_mask.bool()[:, None, None, :]] = -math.inf  # padding keys only
    x = w["model.embed_tokens.weight"][input_ids]  # (B, L, d)
    for i in range(config["num_hidden_layers"]):
        b = f"model.layers.{i}."
        h = rms_norm(x, w[b + "input_layernorm.weight"])

        q, k, v = (
            (h @ w[b + f"self_attn.{name}.weight"].T + w[b + f"self_attn.{name}.bias"])
            .view(B, L, heads, hd)
            .transpose(1, 2)
            for name, heads in (("q_proj", n_heads), ("k_proj", n_kv), ("v_proj", n_kv))
        )  # (B, heads, L, hd)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(n_heads // n_kv, dim=1), v.repeat_interleave(n_heads // n_kv, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + key_bias, dim=-1)  # (B, H, L, L)
        x = x + (att @ v).transpose(1, 2).reshape(B, L, d) @ w[b + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[b + "post_attention_layernorm.weight"])
        gate, up = h @ w[b + "mlp.gate_proj.weight"].T, h @ w[b + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[b + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"])
    return x @ w["lm_head.weight"].T  # (B, L, V)


@pytest.mark.parametrize("attn_implementation", ATTN_IMPLEMENTATIONS)
def test_logits_match_reference(attn_implementation):
    model = build_dream(seed=1)
    model.set_attn_implementation(attn_implementation)
    assert all(not layer.self_attn.is_causal for layer in model.model.layers)
    ids = torch.randint(0, 120, (2, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits
    ref = reference_forward(model.state_dict(), tiny_dream_config(), ids)
    assert (logits.double() - ref).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("attn_implementation", ATTN_IMPLEMENTATIONS)
def test_bidirectional_and_left_padding(attn_implementation):
    model = build_dream(seed=2)
    model.set_attn_implementation(attn_implementation)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 100, (1, 10), generator=g)
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 100
    short = torch.randint(0, 100, (6,), generator=g)
    batch = torch.stack([ids[0], F.pad(short, (4, 0), value=100)])  # row 1 left padded with the pad id
    mask = torch.ones_like(batch)
    mask[1, :4] = 0
    with torch.no_grad():
        assert (model(ids).logits[0, 0] - model(changed).logits[0, 0]).abs().max() > 1e-3
        padded = model(batch, attention_mask=mask).logits
        alone = model(short[None]).logits[0]
    assert (padded[1, 4:] - alone).abs().max() <= 1e-5
    assert (padded[0] - model(ids).logits[0]).abs().max() <= 1e-5
    ref = reference_forward(model.state_dict(), tiny_dream_config(), batch, mask)
    assert (padded[mask.bool()].double() - ref[mask.bool()]).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("trust_remote_code", [None, True])
def test_hub_style_checkpoint_loads_without_remote_code(tmp_path, trust_remote_code):
    model = build_dream(seed=3)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "Dream" and saved["mask_token_id"] == 110
    assert saved["auto_map"] == tiny_dream_config()["auto_map"]  # kept for Dream's own code, never used here
    # Turn the folder into a hub-like one: Dream's config.json with auto_map, and remote code that must not run.
    (tmp_path / "config.json").write_text(json.dumps(tiny_dream_config()))
    for name in ("configuration_dream.py", "modeling_dream.py"):
        (tmp_path / name).write_text("raise RuntimeError('remote code was executed')\n")
    kwargs = {} if trust_remote_code is None else {"trust_remote_code": trust_remote_code}
    config = transformers.AutoConfig.from_pretrained(tmp_path, **kwargs)
    assert type(config) is DreamConfig and config.mask_token_id == 110
    ids = torch.randint(0, 120, (2, 8), generator=torch.Generator().manual_seed(3))
    for auto_class in (transformers.AutoModel, transformers.AutoModelForCausalLM):
        loaded, info = auto_class.from_pretrained(tmp_path, output_loading_info=True, **kwargs)
        assert type(loaded) is DreamModel
        assert not info["missing_keys"] and not info["unexpected_keys"]
        with torch.no_grad():
            assert torch.equal(loaded.eval()(ids).logits, model(ids).logits)


def test_unsupported_config_raises():
    with pytest.raises(ValueError, match="use_sliding_window"):
        DreamConfig(**tiny_dream_config(use_sliding_window=True, sliding_window=4, max_window_layers=0))
    with pytest.raises(ValueError, match="mask_token_id"):
        DreamConfig(**tiny_dream_config(mask_token_id=500))


def test_cache_and_generate_are_refused():
    from transformers import DynamicCache

    model = build_dream()
    ids = torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match="bidirectionally"):
        model(ids, past_key_values=DynamicCache(config=model.config))
    with pytest.raises(NotImplementedError, match="masked diffusion"):
        model.generate(ids)


# ----------------------------------------------------------------------------------------------------------------
# Against Dream's original code (tests/fixtures/dream-tiny) and checkpoints that code loads.


def load_fixture(path=FIXTURE):
    model, info = transformers.AutoModel.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def test_fixture_logits_match_dreams_code():
    ref = load_file(FIXTURE / "reference.safetensors")
    model = load_fixture()
    assert model.config.rope_parameters["rope_theta"] == 1e6
    with torch.no_grad():
        plain = model(ref["plain_input_ids"]).logits
        mask = ref["padded_attention_mask"]
        padded = model(ref["padded_input_ids"], attention_mask=mask).logits
    assert (plain - ref["plain_logits_raw"]).abs().max() <= 1e-5
    assert (padded - ref["padded_logits_raw"])[mask.bool()].abs().max() <= 1e-5  # pad positions are meaningless


def test_saved_folder_is_dreams_own_format(tmp_path):
    """What Dream's code reads: config.json's keys and values (rope_theta, auto_map, ...), the weight names and
    values, generation_config.json's mask token. Then our loader gives the same logits from the saved folder."""
    model = load_fixture()
    model.save_pretrained(tmp_path)
    original = json.loads((FIXTURE / "config.json").read_text())
    saved = json.loads((tmp_path / "config.json").read_text())
    for key, value in original.items():
        if key != "transformers_version":
            assert saved.get(key, "<missing>") == value, key  # rope_theta 1e6, auto_map, model_type "Dream", ...
    assert "rope_parameters" not in saved and "layer_types" not in saved  # keys transformers 4 would not read
    weights, fixture_weights = load_file(tmp_path / "model.safetensors"), load_file(FIXTURE / "model.safetensors")
    assert sorted(weights) == sorted(fixture_weights)
    assert all(torch.equal(weights[k], fixture_weights[k]) for k in weights)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation["mask_token_id"] == 95  # Dream's generation config has no other source for it
    ref = load_file(FIXTURE / "reference.safetensors")
    with torch.no_grad():
        assert torch.equal(load_fixture(tmp_path)(ref["plain_input_ids"]).logits, model(ref["plain_input_ids"]).logits)


def test_remote_code_files_are_copied_not_run(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(FIXTURE, source)
    code = {
        "configuration_dream.py": "raise RuntimeError('remote code was executed')\n",
        "modeling_dream.py": "from .generation_utils import DreamGenerationMixin\nraise RuntimeError('executed')\n",
        "generation_utils.py": "raise RuntimeError('remote code was executed')\n",
    }
    for name, text in code.items():
        (source / name).write_text(text)
    (source / "unrelated_script.py").write_text("print('not part of the model')\n")
    model = load_fixture(source)
    model.save_pretrained(tmp_path / "saved")
    for name, text in code.items():  # the auto_map modules and what they import relatively
        assert (tmp_path / "saved" / name).read_text() == text
    assert not (tmp_path / "saved" / "unrelated_script.py").exists()
    assert type(load_fixture(tmp_path / "saved")) is DreamModel  # and still loads natively


def test_hub_checkpoint_auto_map_points_at_its_repo(tmp_path):
    # Loaded from a hub repo (no code files here): the saved auto_map names the repo, as transformers resolves it.
    model = load_fixture()
    model.config._name_or_path = "Dream-org/Dream-v0-Instruct-7B"
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["auto_map"] == {
        "AutoConfig": "Dream-org/Dream-v0-Instruct-7B--configuration_dream.DreamConfig",
        "AutoModel": "Dream-org/Dream-v0-Instruct-7B--modeling_dream.DreamModel",
    }
    assert type(load_fixture(tmp_path)) is DreamModel


def test_non_default_rope_is_saved_as_rope_scaling(tmp_path):
    model = build_dream(rope_scaling={"type": "linear", "factor": 2.0})
    assert model.config.rope_parameters["rope_type"] == "linear"
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_theta"] == 1e6
    assert saved["rope_scaling"] == {"type": "linear", "rope_type": "linear", "factor": 2.0}
    reloaded = transformers.AutoModel.from_pretrained(tmp_path)
    assert reloaded.config.rope_parameters == model.config.rope_parameters
    ids = torch.randint(0, 120, (1, 9), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.equal(reloaded.eval()(ids).logits, model(ids).logits)


def test_config_without_auto_map_builds_saves_and_loads(tmp_path):
    config = DreamConfig(**{k: v for k, v in tiny_dream_config().items() if k != "auto_map"})
    assert config.auto_map == {}  # never None: the Auto classes test `name in config.auto_map`
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert type(model) is DreamModel
    model.save_pretrained(tmp_path)
    assert "auto_map" not in json.loads((tmp_path / "config.json").read_text())  # nothing to point at
    assert type(transformers.AutoModel.from_pretrained(tmp_path)) is DreamModel
