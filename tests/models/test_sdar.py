"""SDAR (Qwen3 with block-causal attention) against SDAR's original code (fixture) and a literal reference forward."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file
from transformers import DynamicCache

import stabledrl_trl  # noqa: F401  (registers "sdar" with the Auto classes)
from stabledrl_trl.models.sdar import SDARConfig, SDARForCausalLM, block_causal_mask
from stabledrl_trl.tiny import tiny_sdar_config_dict

FIXTURE = Path(__file__).parent.parent / "fixtures" / "sdar-tiny"
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def build_sdar(seed: int = 0, **overrides) -> SDARForCausalLM:
    """Tiny SDARForCausalLM with weights from `seed` (global RNG untouched), norm weights randomised too."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SDARForCausalLM(SDARConfig(**tiny_sdar_config_dict(**overrides)))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
                else:
                    param.copy_(0.3 * torch.randn_like(param))
    return model.eval()


def reference_forward(sd: dict, config: dict, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
    """Qwen3 (q/k RMSNorm, GQA, RoPE) with SDAR's block-causal attention, float64, on Qwen3-named weights.

    Positions count real tokens; query at p sees real keys at p_k with p_k // block <= p // block.
    """
    n_heads, n_kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    eps, theta, bs = config["rms_norm_eps"], config["rope_theta"], config["block_size"]
    w = {k: v.double() for k, v in sd.items()}
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    B, L = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones(B, L, dtype=torch.long)
    real = attention_mask.bool()
    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.cat([pos.double()[..., None] * inv_freq] * 2, dim=-1)[:, None]  # (B, 1, L, hd)
    cos, sin = angles.cos(), angles.sin()
    visible = (pos[:, None, :] // bs <= pos[:, :, None] // bs) & real[:, None, :]  # (B, Lq, Lk)
    bias = torch.zeros(B, 1, L, L, dtype=torch.float64).masked_fill(~visible[:, None], -math.inf)
    bias[:, 0][~real] = 0.0  # padding queries: any finite row (never compared)

    def rms_norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rope(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    x = w["model.embed_tokens.weight"][input_ids]  # (B, L, d)
    for i in range(config["num_hidden_layers"]):
        b = f"model.layers.{i}."
        h = rms_norm(x, w[b + "input_layernorm.weight"])
        q = (h @ w[b + "self_attn.q_proj.weight"].T).view(B, L, n_heads, hd)
        k = (h @ w[b + "self_attn.k_proj.weight"].T).view(B, L, n_kv, hd)
        v = (h @ w[b + "self_attn.v_proj.weight"].T).view(B, L, n_kv, hd).transpose(1, 2)
        q = rope(rms_norm(q, w[b + "self_attn.q_norm.weight"]).transpose(1, 2))  # (B, H, L, hd)
        k = rope(rms_norm(k, w[b + "self_attn.k_norm.weight"]).transpose(1, 2))
        k, v = k.repeat_interleave(n_heads // n_kv, dim=1), v.repeat_interleave(n_heads // n_kv, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, dim=-1)  # (B, H, L, L)
        x = x + (att @ v).transpose(1, 2).reshape(B, L, n_heads * hd) @ w[b + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[b + "post_attention_layernorm.weight"])
        x = (
            x
            + (F.silu(h @ w[b + "mlp.gate_proj.weight"].T) * (h @ w[b + "mlp.up_proj.weight"].T))
            @ w[b + "mlp.down_proj.weight"].T
        )
    return rms_norm(x, w["model.norm.weight"]) @ head.T  # (B, L, V)


# ----------------------------------------------------------------------------------------------------------------------
# Against SDAR's original code


@pytest.mark.parametrize("attn_implementation", ATTN_IMPLEMENTATIONS)
def test_fixture_denoising_steps_match_original(attn_implementation):
    """Every recorded denoising forward of SDAR's own generation: logits of the block after the committed prefix."""
    model = transformers.AutoModelForCausalLM.from_pretrained(FIXTURE, attn_implementation=attn_implementation)
    assert type(model) is SDARForCausalLM and model.config.block_size == 4 and model.config.mask_token_id == 95
    ref = load_file(FIXTURE / "reference.safetensors")
    x = ref["x"]  # (1, 20)
    steps = sorted(int(k[4:-4]) for k in ref if k.endswith("_ids"))
    assert steps == list(range(14))
    for i in steps:
        ids, pos = ref[f"step{i}_ids"], ref[f"step{i}_pos"]
        s = int(pos[0, 0])
        assert torch.equal(pos[0], torch.arange(s, s + 4))
        with torch.no_grad():
            full = model(torch.cat([x[:, :s], ids], dim=1)).logits[:, s:]  # plain forward, no mask passed
            cache = DynamicCache(config=model.config)
            if s:
                model(x[:, :s], cache=cache, use_cache=True)  # prefill the committed blocks
            cached = model(ids, cache=cache, use_cache=True).logits
        assert (full - ref[f"step{i}_logits"]).abs().max() <= 1e-5, i
        assert (cached - ref[f"step{i}_logits"]).abs().max() <= 1e-5, i


@pytest.mark.parametrize("trust_remote_code", [None, True])
def test_fixture_loads_without_remote_code(tmp_path, trust_remote_code):
    """The hub folder (config with auto_map) loads natively; the remote code it names is never executed, even with
    trust_remote_code=True."""
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((FIXTURE / name).read_bytes())
    for name in ("configuration_sdar.py", "modeling_sdar.py"):
        (tmp_path / name).write_text("raise RuntimeError('remote code was executed')\n")
    kwargs = {} if trust_remote_code is None else {"trust_remote_code": trust_remote_code}
    config = transformers.AutoConfig.from_pretrained(tmp_path, **kwargs)
    assert type(config) is SDARConfig
    assert (config.block_size, config.mask_token_id, config.tie_word_embeddings) == (4, 95, False)
    assert config.rope_parameters["rope_theta"] == 1e4
    for auto_class in (transformers.AutoModel, transformers.AutoModelForCausalLM):
        model, info = auto_class.from_pretrained(tmp_path, output_loading_info=True, **kwargs)
        assert type(model) is SDARForCausalLM
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    weights = load_file(FIXTURE / "model.safetensors")
    assert set(weights) == set(model.state_dict())
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def test_fixture_two_copy_mask_matches_original():
    """A 4-D mask goes to the layers as is: the fixture's [noisy || clean] forward with the BD3-LM mask."""
    model = transformers.AutoModelForCausalLM.from_pretrained(FIXTURE)
    ref = load_file(FIXTURE / "reference.safetensors")
    noisy, x = ref["noisy"], ref["x"]
    n = x.shape[1]
    blk = torch.arange(n) // 4
    same, earlier, upto = blk[:, None] == blk, blk[None, :] < blk[:, None], blk[None, :] <= blk[:, None]
    mask = torch.cat([torch.cat([same, earlier], 1), torch.cat([torch.zeros(n, n, dtype=torch.bool), upto], 1)])
    position_ids = torch.arange(n).repeat(2)[None]
    with torch.no_grad():
        logits = model(torch.cat([noisy, x], 1), attention_mask=mask[None, None], position_ids=position_ids).logits
    assert (logits - ref["logits2n"]).abs().max() <= 1e-5


def test_saved_folder_keeps_sdar_names_and_keys(tmp_path):
    """save_pretrained writes SDAR's config keys and values and the checkpoint's weight names, for SDAR's own code."""
    model = transformers.AutoModelForCausalLM.from_pretrained(FIXTURE)
    model.save_pretrained(tmp_path)
    original = json.loads((FIXTURE / "config.json").read_text())
    saved = json.loads((tmp_path / "config.json").read_text())
    differ = {k for k in original if saved.get(k, "<missing>") != original[k]}
    assert differ == {"transformers_version"}, {k: (original[k], saved.get(k)) for k in differ}
    assert "rope_parameters" not in saved
    before, after = load_file(FIXTURE / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert set(before) == set(after) and all(torch.equal(before[k], after[k]) for k in before)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = load_file(FIXTURE / "reference.safetensors")["x"]
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)


# ----------------------------------------------------------------------------------------------------------------------
# Against the literal reference


@pytest.mark.parametrize("attn_implementation", ATTN_IMPLEMENTATIONS)
@pytest.mark.parametrize("overrides", [{}, {"num_key_value_heads": 2}, {"tie_word_embeddings": True}])
def test_logits_match_reference(attn_implementation, overrides):
    model = build_sdar(seed=1, **overrides)
    model.set_attn_implementation(attn_implementation)
    if overrides.get("tie_word_embeddings"):
        assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(2, 101, (2, 15), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits
    ref = reference_forward(model.state_dict(), tiny_sdar_config_dict(**overrides), ids)
    assert (logits.double() - ref).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item())
    # block-causal: changing a token changes its own block and later ones, never an earlier block
    changed = ids.clone()
    changed[:, 9] = (ids[:, 9] + 1) % 101
    with torch.no_grad():
        diff = (model(changed).logits - logits).abs().amax(dim=(0, 2))  # (L,)
    assert diff[:8].max() == 0 and diff[8:].min() > 1e-4


@pytest.mark.parametrize("attn_implementation", ATTN_IMPLEMENTATIONS)
def test_left_padded_row_gives_the_row_alone(attn_implementation):
    """Blocks are aligned on a row's real tokens: a left-padded row (pad not a multiple of the block) is unchanged."""
    model = build_sdar(seed=2, num_key_value_heads=2)
    model.set_attn_implementation(attn_implementation)
    g = torch.Generator().manual_seed(2)
    long_row = torch.randint(2, 101, (13,), generator=g)
    short = torch.randint(2, 101, (7,), generator=g)
    batch = torch.stack([long_row, F.pad(short, (6, 0), value=0)])  # row 1: 6 pad columns
    mask = torch.ones_like(batch)
    mask[1, :6] = 0
    with torch.no_grad():
        padded = model(batch, attention_mask=mask).logits
        alone_short = model(short[None]).logits[0]
        alone_long = model(long_row[None]).logits[0]
    # float32 kernels of different shapes round differently (~1e-6 relative on logits of size ~5); a misaligned
    # block or an attended pad changes logits by O(1)
    assert (padded[1, 6:] - alone_short).abs().max() <= 5e-5
    assert (padded[0] - alone_long).abs().max() <= 5e-5
    ref = reference_forward(model.state_dict(), tiny_sdar_config_dict(num_key_value_heads=2), batch, mask)
    real = mask.bool()
    assert (padded[real].double() - ref[real]).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item())


def test_cached_blocks_equal_full_forward_with_padding():
    """A 2-D mask over (cached + new) columns: a left-padded batch decoded block by block equals one forward.

    (The padding is a whole block, so each row's blocks sit in the same columns, as the block sampler lays them out.)
    """
    model = build_sdar(seed=3)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 101, (2, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        cache = DynamicCache(config=model.config)
        pieces = []
        for s in range(0, 16, 4):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, s : s + 4]
            out = model(ids[:, s : s + 4], attention_mask=mask[:, : s + 4], position_ids=positions, cache=cache,
                        use_cache=True)  # fmt: skip
            pieces.append(out.logits)
    cached = torch.cat(pieces, 1)
    assert (cached - full)[mask.bool()].abs().max() <= 1e-5


def test_bf16_close_to_reference():
    model = build_sdar(seed=4, num_key_value_heads=2).to(torch.bfloat16)
    ids = torch.randint(2, 101, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.dtype == torch.bfloat16
    ref = reference_forward(model.state_dict(), tiny_sdar_config_dict(num_key_value_heads=2), ids)
    err = (logits.double() - ref).abs().max().item()
    assert err <= 0.05 * ref.abs().max().item(), err


@pytest.mark.parametrize("tie", [False, True])
def test_save_load_round_trip(tmp_path, tie):
    model = build_sdar(seed=5, tie_word_embeddings=tie)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "sdar" and saved["block_size"] == 4 and saved["mask_token_id"] == 1
    assert saved["tie_word_embeddings"] is tie and saved["rope_theta"] == 1e4 and saved["rope_scaling"] is None
    keys = set(load_file(tmp_path / "model.safetensors"))
    assert ("lm_head.weight" in keys) is not tie
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.randint(2, 101, (2, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids).logits, model(ids).logits)


def test_gradient_checkpointing_gives_equal_gradients():
    ids = torch.randint(2, 101, (2, 12), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    grads = []
    for checkpointing in (False, True):
        model = build_sdar(seed=6, num_key_value_heads=2).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        loss = model(ids, attention_mask=mask).logits.logsumexp(-1)[mask.bool()].mean()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-5) for n in grads[0])
    assert any(g.abs().max() > 0 for g in grads[0].values())


def test_block_causal_mask_hand_example():
    q = torch.tensor([[0, 1, 2, 3, 4, 5]])
    real = torch.tensor([[True] * 6])
    mask = block_causal_mask(q, q, real, 2)[0, 0].long()
    expected = torch.tensor([[1, 1, 0, 0, 0, 0]] * 2 + [[1, 1, 1, 1, 0, 0]] * 2 + [[1, 1, 1, 1, 1, 1]] * 2)
    assert torch.equal(mask, expected)


def test_unsupported_config_and_calls_raise():
    with pytest.raises(ValueError, match="block_size"):
        SDARConfig(**tiny_sdar_config_dict(block_size=0))
    with pytest.raises(ValueError, match="mask_token_id"):
        SDARConfig(**tiny_sdar_config_dict(mask_token_id=500))
    with pytest.raises(ValueError, match="use_sliding_window"):
        SDARConfig(**tiny_sdar_config_dict(use_sliding_window=True, sliding_window=4, max_window_layers=0))
    model = build_sdar()
    ids = torch.randint(2, 101, (1, 6), generator=torch.Generator().manual_seed(7))
    with pytest.raises(ValueError, match="attention_mask must be 2-D"):
        model(ids, attention_mask=torch.ones(1, 5, dtype=torch.long))
    with pytest.raises(NotImplementedError, match="block diffusion"):
        model.generate(ids)
