"""LLaDA as a transformers model: logits against LLaDA's own code and against a literal reference forward.

`reference_forward` below is written from LLaDA's architecture description, reading LLaDA-named weights: it is first
checked against the logits LLaDA's original code produced for the fixture, then used as the reference for
checkpoint variants the fixture does not cover (GQA, tied embeddings, other RoPE theta / eps, sharded files, bf16).
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

import stabledrl_trl  # noqa: F401  (registers "llada" with the Auto classes)
from stabledrl_trl.models.llada import LLaDAConfig, LLaDAModel, LLaDAModelLM
from stabledrl_trl.tiny import tiny_llada_config_dict

ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


# ----------------------------------------------------------------------------------------------------------------
# Literal reference: LLaDA's forward in plain torch, on LLaDA-named weights, in float64.


def kv_heads(config: dict) -> int:
    """LLaDA's effective key/value head count: 1 with multi_query_attention, else n_kv_heads (default n_heads)."""
    return 1 if config.get("multi_query_attention") else config.get("n_kv_heads") or config["n_heads"]


def reference_forward(state_dict: dict, config: dict, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
    """LLaDA's logits (B, L, V) in float64; `attention_mask` (B, L) hides padding keys, positions skip padding."""
    d, n_heads = config["d_model"], config["n_heads"]
    n_kv = kv_heads(config)
    hd = d // n_heads
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    w = {k: v.double() for k, v in state_dict.items()}
    p = "model.transformer."
    B, L = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones(B, L, dtype=torch.long)
    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0).double()  # (B, L)
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)  # (hd/2,)
    angles = torch.cat([pos[..., None] * inv_freq] * 2, dim=-1)[:, None]  # (B, 1, L, hd)
    cos, sin = angles.cos(), angles.sin()

    def rms_norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rope(x):  # (B, H, L, hd), rotate-half
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    key_bias = torch.zeros(B, 1, 1, L, dtype=torch.float64)
    key_bias[~attention_mask.bool()[:, None, None, :]] = -math.inf  # padding keys only: no causal mask
    x = w[p + "wte.weight"][input_ids]  # (B, L, d)
    for i in range(config["n_layers"]):
        b = f"{p}blocks.{i}."
        h = rms_norm(x, w[b + "attn_norm.weight"])
        q = (h @ w[b + "q_proj.weight"].T).view(B, L, n_heads, hd).transpose(1, 2)  # (B, H, L, hd)
        k = (h @ w[b + "k_proj.weight"].T).view(B, L, n_kv, hd).transpose(1, 2)  # (B, Hkv, L, hd)
        v = (h @ w[b + "v_proj.weight"].T).view(B, L, n_kv, hd).transpose(1, 2)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(n_heads // n_kv, dim=1)  # query head j reads kv head j // (H / Hkv)
        v = v.repeat_interleave(n_heads // n_kv, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + key_bias, dim=-1)  # (B, H, L, L)
        y = (att @ v).transpose(1, 2).reshape(B, L, d)
        x = x + y @ w[b + "attn_out.weight"].T
        h = rms_norm(x, w[b + "ff_norm.weight"])
        x = x + (F.silu(h @ w[b + "ff_proj.weight"].T) * (h @ w[b + "up_proj.weight"].T)) @ w[b + "ff_out.weight"].T
    x = rms_norm(x, w[p + "ln_f.weight"])
    head = w[p + "wte.weight"] if config["weight_tying"] else w[p + "ff_out.weight"]
    return x @ head.T  # (B, L, V)


def random_llada_state_dict(config: dict, seed: int) -> dict:
    """Random weights under LLaDA's checkpoint names (no `ff_out` head when weight_tying)."""
    g = torch.Generator().manual_seed(seed)
    d, n_heads = config["d_model"], config["n_heads"]
    kv_dim = kv_heads(config) * (d // n_heads)
    mlp, rows = config["mlp_hidden_size"], config.get("embedding_size") or config["vocab_size"]

    def randn(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    p = "model.transformer."
    sd = {p + "wte.weight": randn(rows, d, scale=1.0), p + "ln_f.weight": 1.0 + randn(d)}
    if not config["weight_tying"]:
        sd[p + "ff_out.weight"] = randn(rows, d)
    for i in range(config["n_layers"]):
        b = f"{p}blocks.{i}."
        sd.update(
            {
                b + "attn_norm.weight": 1.0 + randn(d),
                b + "ff_norm.weight": 1.0 + randn(d),
                b + "q_proj.weight": randn(d, d, scale=0.3),
                b + "k_proj.weight": randn(kv_dim, d, scale=0.3),
                b + "v_proj.weight": randn(kv_dim, d),
                b + "attn_out.weight": randn(d, d),
                b + "ff_proj.weight": randn(mlp, d),
                b + "up_proj.weight": randn(mlp, d),
                b + "ff_out.weight": randn(d, mlp),
            }
        )
    return sd


def write_llada_checkpoint(path, config: dict, state_dict: dict, shards: int = 1) -> None:
    """Save like a LLaDA hub checkpoint: LLaDA's config keys with an auto_map, LLaDA weight names."""
    path.mkdir(parents=True, exist_ok=True)
    config = dict(config)
    config["auto_map"] = {
        "AutoConfig": "configuration_llada.LLaDAConfig",
        "AutoModel": "modeling_llada.LLaDAModelLM",
        "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
    }
    (path / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(state_dict, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    keys = sorted(state_dict)
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state_dict[k].contiguous() for k in keys[s::shards]}
        save_file(part, str(path / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    total = sum(t.numel() * t.element_size() for t in state_dict.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


def load(path, **kwargs):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kwargs)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


@pytest.fixture(scope="module")
def reference(llada_fixture_dir):
    return load_file(str(llada_fixture_dir / "reference_logits.safetensors"))


# ----------------------------------------------------------------------------------------------------------------
# Against LLaDA's own code (fixture).


def test_reference_forward_matches_llada_code(llada_fixture_dir, reference):
    config = json.loads((llada_fixture_dir / "config.json").read_text())
    state_dict = load_file(str(llada_fixture_dir / "model.safetensors"))
    logits = reference_forward(state_dict, config, reference["input_ids"])
    assert (logits - reference["logits"].double()).abs().max() <= 1e-4


@pytest.mark.parametrize("attn_implementation", ATTN_IMPLEMENTATIONS)
def test_fixture_logits_match_llada_code(llada_fixture_dir, reference, attn_implementation):
    model = load(llada_fixture_dir, attn_implementation=attn_implementation)
    assert isinstance(model, LLaDAModelLM) and model.dtype == torch.float32
    assert model.config._attn_implementation == attn_implementation
    with torch.no_grad():
        logits = model(reference["input_ids"]).logits
    assert logits.shape == reference["logits"].shape == (3, 24, 320)
    assert (logits - reference["logits"]).abs().max() <= 1e-4


# ----------------------------------------------------------------------------------------------------------------
# Registration and remote code.


def test_auto_classes_resolve_without_remote_code(llada_fixture_dir):
    config = transformers.AutoConfig.from_pretrained(llada_fixture_dir)
    assert isinstance(config, LLaDAConfig)
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (64, 4, 2)
    assert (config.intermediate_size, config.vocab_size, config.max_position_embeddings) == (192, 320, 512)
    assert (config.mask_token_id, config.eos_token_id, config.pad_token_id, config.bos_token_id) == (
        317,
        316,
        316,
        None,
    )
    assert config.rope_parameters["rope_theta"] == 500000.0 and config.rms_norm_eps == 1e-5
    assert config.d_model == 64 and config.n_heads == 4  # LLaDA's names read the same fields
    # the checkpoint's auto_map is kept (written back on save) but never used: the native class is registered
    assert config.auto_map == json.loads((llada_fixture_dir / "config.json").read_text())["auto_map"]
    for auto_class in (transformers.AutoModel, transformers.AutoModelForCausalLM, transformers.AutoModelForMaskedLM):
        assert type(auto_class.from_config(config)) is LLaDAModelLM


@pytest.mark.parametrize("trust_remote_code", [None, False, True])
def test_remote_code_is_never_run(llada_fixture_dir, tmp_path, trust_remote_code):
    # The checkpoint folder carries LLaDA-style remote code files that would fail loudly if imported.
    ckpt = tmp_path / "ckpt"
    shutil.copytree(llada_fixture_dir, ckpt)
    for name in ("configuration_llada.py", "modeling_llada.py"):
        (ckpt / name).write_text("raise RuntimeError('remote code was executed')\n")
    assert "auto_map" in json.loads((ckpt / "config.json").read_text())
    kwargs = {} if trust_remote_code is None else {"trust_remote_code": trust_remote_code}
    model = load(ckpt, **kwargs)
    assert type(model) is LLaDAModelLM
    assert type(transformers.AutoModel.from_pretrained(ckpt, **kwargs)) is LLaDAModelLM


# ----------------------------------------------------------------------------------------------------------------
# Bidirectional attention and padding.


@pytest.mark.parametrize("attn_implementation", ATTN_IMPLEMENTATIONS)
def test_attention_is_bidirectional(llada_fixture_dir, attn_implementation):
    model = load(llada_fixture_dir, attn_implementation=attn_implementation)
    ids = torch.randint(0, 316, (1, 12), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 316
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
        a_masked = model(ids, attention_mask=torch.ones_like(ids)).logits
        b_masked = model(changed, attention_mask=torch.ones_like(ids)).logits
    # A change at the last position reaches position 0: no causal mask, with or without a padding mask.
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-3
    assert (a_masked[0, 0] - b_masked[0, 0]).abs().max() > 1e-3
    assert (a - a_masked).abs().max() <= 1e-5


@pytest.mark.parametrize("attn_implementation", ATTN_IMPLEMENTATIONS)
def test_left_padding_matches_row_alone(llada_fixture_dir, attn_implementation):
    model = load(llada_fixture_dir, attn_implementation=attn_implementation)
    config = json.loads((llada_fixture_dir / "config.json").read_text())
    state_dict = load_file(str(llada_fixture_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    lengths, L, pad = [10, 7, 4], 10, 316
    rows = [torch.randint(0, 316, (n,), generator=g) for n in lengths]
    ids = torch.stack([F.pad(r, (L - len(r), 0), value=pad) for r in rows])  # (3, 10), left padded
    mask = (torch.arange(L)[None] >= (L - torch.tensor(lengths))[:, None]).long()  # (3, 10)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask).logits
        for i, row in enumerate(rows):
            alone = model(row[None]).logits[0]
            assert (batch[i, L - len(row) :] - alone).abs().max() <= 1e-5
    ref = reference_forward(state_dict, config, ids, mask)
    real = mask.bool()
    assert (batch[real].double() - ref[real]).abs().max() <= 1e-4


# ----------------------------------------------------------------------------------------------------------------
# Checkpoint variants against the literal reference.

VARIANTS = {
    "gqa": dict(n_kv_heads=2),
    "multi_query": dict(n_kv_heads=None, multi_query_attention=True),
    "tied": dict(weight_tying=True),
    "theta_eps": dict(rope_theta=500000.0, rms_norm_eps=1e-6),
    "embedding_rows": dict(vocab_size=101, embedding_size=128),
}


def variant_config(**overrides) -> dict:
    config = tiny_llada_config_dict(**overrides)
    config.update(max_sequence_length=64)
    return config


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_matches_reference(tmp_path, name):
    config = variant_config(**VARIANTS[name])
    state_dict = random_llada_state_dict(config, seed=len(name))
    write_llada_checkpoint(tmp_path, config, state_dict)
    model = load(tmp_path)
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(ids).logits
    ref = reference_forward(state_dict, config, ids)
    assert logits.shape == ref.shape == (2, 16, config.get("embedding_size") or 101)
    assert (logits.double() - ref).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item())
    if config["weight_tying"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if name == "multi_query":
        assert model.config.num_key_value_heads == 1


def test_sharded_checkpoint_with_index(tmp_path):
    config = variant_config(n_kv_heads=2, n_layers=3)
    state_dict = random_llada_state_dict(config, seed=3)
    write_llada_checkpoint(tmp_path, config, state_dict, shards=3)
    assert len(list(tmp_path.glob("model-*.safetensors"))) == 3
    model = load(tmp_path)
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(ids).logits
    ref = reference_forward(state_dict, config, ids)
    assert (logits.double() - ref).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item())


def test_bf16_checkpoint(tmp_path):
    config = variant_config(n_kv_heads=2)
    state_dict = {k: v.to(torch.bfloat16) for k, v in random_llada_state_dict(config, seed=4).items()}
    write_llada_checkpoint(tmp_path, config | {"torch_dtype": "bfloat16"}, state_dict)
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    ref = reference_forward(state_dict, config, ids)  # float64 on the bf16 values
    scale = ref.abs().max().item()
    # Loaded in float32 the bf16 values are exact, so only float32 rounding remains.
    model32 = load(tmp_path, dtype=torch.float32)
    with torch.no_grad():
        logits32 = model32(ids).logits
    assert (logits32.double() - ref).abs().max() <= 1e-4 * max(1.0, scale)
    # Computed in bf16 (8-bit significand, relative rounding 2^-9 per operation), errors of a few 2^-9 accumulate
    # over ~20 rounded operations per layer: allow 5% of the logit scale, while a wrong computation (e.g. a causal
    # mask or swapped gate/up weights) shifts logits by the order of the scale itself.
    model16 = load(tmp_path, dtype=torch.bfloat16)
    assert model16.dtype == torch.bfloat16
    with torch.no_grad():
        logits16 = model16(ids).logits
    assert logits16.dtype == torch.bfloat16
    err = (logits16.double() - ref).abs().max().item()
    assert err <= 0.05 * scale
    # The gate/up swap is the error this tolerance must still catch:
    swapped = dict(state_dict)
    for i in range(config["n_layers"]):
        b = f"model.transformer.blocks.{i}."
        swapped[b + "ff_proj.weight"], swapped[b + "up_proj.weight"] = (
            state_dict[b + "up_proj.weight"],
            state_dict[b + "ff_proj.weight"],
        )
    assert (reference_forward(swapped, config, ids) - ref).abs().max().item() > 4 * err


# ----------------------------------------------------------------------------------------------------------------
# Saving, training features, API.


def test_saved_folder_is_lladas_own_format(llada_fixture_dir, reference, tmp_path):
    """What LLaDA's code reads: config.json's keys and values (auto_map, rope_theta, d_model, ...) and the weights
    under LLaDA's names with the fixture's values; our loader gives the same logits from the saved folder."""
    model = load(llada_fixture_dir)
    model.save_pretrained(tmp_path)
    original = json.loads((llada_fixture_dir / "config.json").read_text())
    saved = json.loads((tmp_path / "config.json").read_text())
    for key, value in original.items():
        if key != "transformers_version":
            assert saved.get(key, "<missing>") == value, key
    assert "hidden_size" not in saved and "rope_parameters" not in saved  # Llama keys LLaDA's code does not read
    written = load_file(str(tmp_path / "model.safetensors"))
    fixture = load_file(str(llada_fixture_dir / "model.safetensors"))
    assert sorted(written) == sorted(fixture)
    assert all(torch.equal(written[k], fixture[k]) for k in fixture)
    reloaded = load(tmp_path)
    with torch.no_grad():
        assert torch.equal(reloaded(reference["input_ids"]).logits, model(reference["input_ids"]).logits)


def test_load_state_dict_reads_llada_names_as_the_trainer_resumes(llada_fixture_dir, tmp_path):
    # transformers' Trainer resumes with model.load_state_dict(file, strict=False): every key must match, in
    # LLaDA's names (what save_pretrained writes) as in the module's own.
    model = load(llada_fixture_dir)
    model.save_pretrained(tmp_path)
    for state_dict in (load_file(str(tmp_path / "model.safetensors")), model.state_dict()):
        fresh = load(llada_fixture_dir)
        with torch.no_grad():
            for p in fresh.parameters():
                p.zero_()
        result = fresh.load_state_dict(state_dict, strict=False)
        assert not result.missing_keys and not result.unexpected_keys
        assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True))
    both = {**model.state_dict(), **load_file(str(tmp_path / "model.safetensors"))}
    with pytest.raises(ValueError, match="both"):
        model.load_state_dict(both)


def test_module_name_format_on_request(llada_fixture_dir, reference, tmp_path):
    model = load(llada_fixture_dir)
    model.save_pretrained(tmp_path, save_original_format=False)
    written = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(written) == sorted(name for name, _ in model.named_parameters())
    original = load_file(str(llada_fixture_dir / "model.safetensors"))
    assert torch.equal(
        written["model.layers.1.mlp.gate_proj.weight"], original["model.transformer.blocks.1.ff_proj.weight"]
    )
    reloaded = load(tmp_path)
    with torch.no_grad():
        assert torch.equal(reloaded(reference["input_ids"]).logits, model(reference["input_ids"]).logits)


def test_remote_code_files_are_copied_and_hub_auto_map_qualified(llada_fixture_dir, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(llada_fixture_dir, source)
    for name in ("configuration_llada.py", "modeling_llada.py"):
        (source / name).write_text("raise RuntimeError('remote code was executed')\n")
    model = load(source)
    model.save_pretrained(tmp_path / "saved")
    for name in ("configuration_llada.py", "modeling_llada.py"):
        assert (tmp_path / "saved" / name).read_text() == (source / name).read_text()
    model.config._name_or_path = "GSAI-ML/LLaDA-8B-Instruct"  # as if loaded from the hub: no files to copy
    model.save_pretrained(tmp_path / "from_hub")
    auto_map = json.loads((tmp_path / "from_hub" / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModel"] == "GSAI-ML/LLaDA-8B-Instruct--modeling_llada.LLaDAModelLM"
    assert not (tmp_path / "from_hub" / "modeling_llada.py").exists()
    assert type(load(tmp_path / "from_hub")) is LLaDAModelLM


def test_tied_model_round_trip(tmp_path):
    config = LLaDAConfig(**variant_config(weight_tying=True))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        model = LLaDAModelLM(config).eval()
    model.save_pretrained(tmp_path)
    assert "model.transformer.ff_out.weight" not in load_file(str(tmp_path / "model.safetensors"))
    reloaded = load(tmp_path)
    ids = torch.randint(0, 101, (2, 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)


def test_gradient_checkpointing_gives_same_loss_and_grads(tiny_llada):
    model = tiny_llada.train()
    ids = torch.randint(5, 101, (2, 12), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0

    mlp_calls = []
    # A pre-hook: checkpoint recomputation stops early, once the last saved tensor is rebuilt inside the MLP.
    model.model.layers[0].mlp.register_forward_pre_hook(lambda *args: mlp_calls.append(1))

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        mlp_calls.clear()
        logits = model(ids, attention_mask=mask).logits
        loss = F.cross_entropy(logits[mask.bool()], ids[mask.bool()])
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss_plain, grads_plain = loss_and_grads()
    assert len(mlp_calls) == 1
    model.gradient_checkpointing_enable()
    loss_ckpt, grads_ckpt = loss_and_grads()
    assert len(mlp_calls) == 2  # the layer really was recomputed during backward
    assert torch.equal(loss_plain, loss_ckpt)
    assert grads_plain.keys() == grads_ckpt.keys()
    for name in grads_plain:
        assert torch.allclose(grads_plain[name], grads_ckpt[name], rtol=1e-5, atol=1e-7), name


def test_labels_give_unshifted_masked_lm_loss(tiny_llada):
    ids = torch.randint(5, 101, (2, 10), generator=torch.Generator().manual_seed(7))
    labels = torch.full_like(ids, -100)
    labels[:, 2:5] = ids[:, 2:5]
    with torch.no_grad():
        out = tiny_llada(ids, labels=labels)
    expected = F.cross_entropy(out.logits[:, 2:5].reshape(-1, 101), ids[:, 2:5].reshape(-1))
    assert torch.allclose(out.loss, expected, atol=1e-6)


def test_embedding_has_no_padding_row(tiny_llada):
    # LLaDA's pad token is EOS, a real token: its embedding must be trainable, unlike Llama's padding_idx row.
    assert tiny_llada.model.embed_tokens.padding_idx is None
    assert tiny_llada.model.embed_tokens.weight[0].abs().sum() > 0


def test_base_model_loads_from_llada_checkpoint(llada_fixture_dir):
    body = LLaDAModel.from_pretrained(llada_fixture_dir)
    full = load(llada_fixture_dir)
    assert torch.equal(body.embed_tokens.weight, full.model.embed_tokens.weight)
    assert torch.equal(body.layers[1].mlp.gate_proj.weight, full.model.layers[1].mlp.gate_proj.weight)


def test_cache_and_generate_are_refused(tiny_llada):
    from transformers import DynamicCache

    ids = torch.randint(5, 101, (1, 6), generator=torch.Generator().manual_seed(8))
    with pytest.raises(ValueError, match="bidirectionally"):
        tiny_llada(ids, past_key_values=DynamicCache(config=tiny_llada.config))
    with pytest.raises(NotImplementedError, match="masked diffusion"):
        tiny_llada.generate(ids)


# ----------------------------------------------------------------------------------------------------------------
# Config parsing and validation.


def test_llama_style_config_equals_llada_style():
    llama_style = LLaDAConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=128,
        vocab_size=101,
        max_position_embeddings=512,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        mask_token_id=1,
        eos_token_id=0,
        pad_token_id=0,
    )
    llada_style = LLaDAConfig(**tiny_llada_config_dict(n_kv_heads=2))
    for field in ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "head_dim"):
        assert getattr(llama_style, field) == getattr(llada_style, field), field
    assert llama_style.intermediate_size == llada_style.intermediate_size == 128
    assert llama_style.rope_parameters == llada_style.rope_parameters
    assert llama_style.to_dict()["d_model"] == 64


def test_mlp_ratio_used_when_mlp_hidden_size_is_null():
    config = LLaDAConfig(**tiny_llada_config_dict(mlp_hidden_size=None, mlp_ratio=3))
    assert config.intermediate_size == 3 * 64


@pytest.mark.parametrize(
    "key, value",
    [
        ("block_type", "sequential"),
        ("layer_norm_type", "default"),
        ("activation_type", "gelu"),
        ("alibi", True),
        ("rope", False),
        ("include_bias", True),
        ("include_qkv_bias", True),
        ("attention_layer_norm", True),
        ("input_emb_norm", True),
        ("scale_logits", True),
        ("layer_norm_with_affine", False),
        ("bias_for_layer_norm", True),
        ("clip_qkv", 8.0),
        ("block_group_size", 2),
        ("residual_dropout", 0.1),
        ("embedding_dropout", 0.1),
    ],
)
def test_unsupported_llada_option_raises(key, value):
    with pytest.raises(ValueError, match=key):
        LLaDAConfig(**tiny_llada_config_dict(**{key: value}))


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(embedding_size=50), "embedding_size"),
        (dict(mask_token_id=101), "mask_token_id"),
        (dict(n_heads=4, n_kv_heads=3), "num_key_value_heads"),
        (dict(n_kv_heads=2, multi_query_attention=True), "multi_query_attention"),
    ],
)
def test_inconsistent_config_raises(overrides, match):
    with pytest.raises(ValueError, match=match):
        LLaDAConfig(**tiny_llada_config_dict(**overrides))


def test_conftest_tiny_llada_is_deterministic_and_leaves_global_rng(request):
    state = torch.random.get_rng_state()
    a = request.getfixturevalue("tiny_llada")
    assert torch.equal(torch.random.get_rng_state(), state)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        b = LLaDAModelLM(LLaDAConfig(**tiny_llada_config_dict()))
    assert not a.training and a.dtype == torch.float32
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
