"""LLaDA2 (MoE block diffusion) against tensors recorded with LLaDA2's original hub code (tests/fixtures/llada2-tiny)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

import stabledrl_trl  # noqa: F401  (registers "llada2_moe" with the Auto classes)
from stabledrl_trl.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeGate, LLaDA2MoeModelLM

FIXTURE = Path(__file__).parent.parent / "fixtures" / "llada2-tiny"
ATOL = 1e-4  # the recorded logits are O(10); float32 kernels differ by ~3e-5


@pytest.fixture(scope="module")
def ref() -> dict:
    return load_file(str(FIXTURE / "reference.safetensors"))


def load(attn: str = "sdpa", **overrides) -> LLaDA2MoeModelLM:
    return AutoModelForCausalLM.from_pretrained(FIXTURE, attn_implementation=attn, block_size=4, **overrides).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_forward_logits_match_original(ref, attn):
    model = load(attn)
    ids, pos = ref["fwd_input_ids"], ref["fwd_position_ids"]
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=torch.zeros(3, 1, 16, 16), position_ids=pos).logits
        block_default = model(input_ids=ids).logits  # no mask: block-causal, positions 0..L-1
        block_4d = model(input_ids=ids, attention_mask=ref["fwd_block_mask"].expand(3, 1, 16, 16), position_ids=pos)
    assert full.dtype == torch.float32 and full.shape == (3, 16, 128)
    torch.testing.assert_close(full, ref["fwd_logits_full"], atol=ATOL, rtol=0)
    torch.testing.assert_close(block_default, ref["fwd_logits_block"], atol=ATOL, rtol=0)
    torch.testing.assert_close(block_4d.logits, ref["fwd_logits_block"], atol=ATOL, rtol=0)
    assert (full - block_default).abs().max() > 1.0  # the two masks really differ on these inputs


def test_two_stream_forward_matches_original(ref):
    """dFactory's [noisy | clean] layout with its additive mask, and the same layout as a boolean mask."""
    model = load()
    with torch.no_grad():
        out = model(input_ids=ref["bd2n_input_ids"], attention_mask=ref["bd2n_mask"],
                    position_ids=ref["bd2n_position_ids"]).logits  # fmt: skip
        as_bool = model(input_ids=ref["bd2n_input_ids"], attention_mask=ref["bd2n_mask"] == 0,
                        position_ids=ref["bd2n_position_ids"]).logits  # fmt: skip
    torch.testing.assert_close(out, ref["bd2n_logits"], atol=ATOL, rtol=0)
    torch.testing.assert_close(as_bool, out, atol=1e-6, rtol=0)


def test_padded_batch_matches_original_and_rows_alone(ref):
    model = load()
    ids, real = ref["pad_input_ids"], ref["pad_attention_mask"].bool()
    with torch.no_grad():
        batch = model(input_ids=ids, attention_mask=ref["pad_attention_mask"]).logits
        torch.testing.assert_close(batch[real], ref["pad_logits"][real], atol=ATOL, rtol=0)
        for row in range(3):
            alone = model(input_ids=ids[row][real[row]][None]).logits[0]
            torch.testing.assert_close(batch[row][real[row]], alone, atol=5e-5, rtol=0)


def test_router_choices_and_weights_match_original(ref):
    model = load()
    seen = {}

    def hook(layer):
        def record(module, inputs, output):
            seen[layer] = output

        return record

    for layer in (1, 2):
        model.model.layers[layer].mlp.gate.register_forward_hook(hook(layer))
    with torch.no_grad():
        out = model(input_ids=ref["fwd_input_ids"], attention_mask=torch.zeros(3, 1, 16, 16),
                    position_ids=ref["fwd_position_ids"], output_router_logits=True)  # fmt: skip
    assert len(out.router_logits) == 2  # layer 0 is dense (first_k_dense_replace = 1)
    for layer in (1, 2):
        logits, idx, weight = seen[layer]
        torch.testing.assert_close(logits.view(3, 16, 8), ref[f"fwd_full_router_logits_l{layer}"], atol=1e-5, rtol=0)
        torch.testing.assert_close(out.router_logits[layer - 1], logits)
        assert torch.equal(idx.view(3, 16, 2), ref[f"fwd_full_router_topk_idx_l{layer}"])  # same order too
        torch.testing.assert_close(weight.view(3, 16, 2), ref[f"fwd_full_router_topk_weight_l{layer}"], atol=1e-6,
                                   rtol=0)  # fmt: skip
        torch.testing.assert_close(weight.sum(-1), torch.full((48,), 2.5))  # routed_scaling_factor, not 1
    with torch.no_grad():
        model(input_ids=ref["fwd_input_ids"])
    for layer in (1, 2):
        assert torch.equal(seen[layer][1].view(3, 16, 2), ref[f"fwd_block_router_topk_idx_l{layer}"])


def test_router_rule_by_hand():
    """Group limit, bias steering the choice only, renormalised unbiased weights: computed by hand on 8 experts."""
    config = LLaDA2MoeConfig(vocab_size=16, hidden_size=8, num_experts=8, n_group=2, topk_group=1,
                             num_experts_per_tok=2, routed_scaling_factor=2.0, head_dim=4, num_attention_heads=2,
                             num_key_value_heads=1, pad_token_id=0)  # fmt: skip (ids inside the 16-token vocabulary)
    gate = LLaDA2MoeGate(config)
    with torch.no_grad():
        gate.weight.copy_(torch.eye(8))
        gate.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]))
    z = torch.tensor([[2.0, 1.9, -3.0, -3.0, 1.0, 0.5, -3.0, -2.0]])  # group 0 sum of top 2 beats group 1 unbiased
    _, idx, weight = gate(z)
    s = torch.sigmoid(z[0])
    # biased group scores: g0 = s0 + s1, g1 = s4 + (s7 + 1.0); g1 wins, and within it 7 (biased) then 4
    assert (s[4] + s[7] + 1.0) > (s[0] + s[1]) > (s[4] + s[5])
    assert idx.tolist() == [[7, 4]]
    expected = torch.stack([s[7], s[4]]) / (s[7] + s[4]) * 2.0
    torch.testing.assert_close(weight[0], expected)
    assert gate.expert_load.tolist() == [0, 0, 0, 0, 1, 0, 0, 1]


def test_kv_cache_of_complete_blocks_is_exact(ref):
    model = load()
    ids = ref["fwd_input_ids"]
    with torch.no_grad():
        full = model(input_ids=ids).logits
        cache = DynamicCache()
        model(input_ids=ids[:, :8], cache=cache, use_cache=True)
        assert cache.get_seq_length() == 8
        last = model(input_ids=ids[:, 8:], cache=cache, use_cache=True).logits
    torch.testing.assert_close(last, full[:, 8:], atol=5e-5, rtol=0)


def test_bf16_forward_is_close_to_float32(ref):
    model32, model16 = load(), load(dtype=torch.bfloat16)
    assert model16.model.layers[1].mlp.experts[0].gate_proj.weight.dtype == torch.bfloat16
    with torch.no_grad():
        a = model32(input_ids=ref["fwd_input_ids"]).logits
        b = model16(input_ids=ref["fwd_input_ids"]).logits
    assert b.dtype == torch.float32 and torch.isfinite(b).all()
    assert (a - b).abs().mean() / a.abs().mean() < 0.15  # bf16 rounding, and a few routing flips
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8


def test_save_and_reload_keeps_the_original_format(tmp_path, ref):
    model = load()
    model.save_pretrained(tmp_path)
    original = json.loads((FIXTURE / "config.json").read_text())
    saved = json.loads((tmp_path / "config.json").read_text())
    for key, value in original.items():
        if key in ("transformers_version", "dtype"):
            continue
        assert saved.get(key) == value, key
    assert saved["torch_dtype"] == "float32" and saved["block_size"] == 4
    assert set(load_file(str(tmp_path / "model.safetensors"))) == set(load_file(str(FIXTURE / "model.safetensors")))
    assert AutoConfig.from_pretrained(tmp_path).model_type == "llada2_moe"
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert again.config.block_size == 4
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ref["fwd_input_ids"]).logits, ref["fwd_logits_block"], atol=ATOL,
                                   rtol=0)  # fmt: skip


def test_gradient_checkpointing_gives_equal_gradients(ref):
    grads = []
    for checkpointing in (False, True):
        model = load()
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        logits = model(input_ids=ref["fwd_input_ids"]).logits
        logits.logsumexp(-1).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)
    # with 2 tokens at most 4 of the 8 experts of a layer run: the others get no gradient (why DDP must search for
    # unused parameters with an MoE model)
    model = load().train()
    model(input_ids=ref["fwd_input_ids"][:1, :2]).logits.sum().backward()
    expert_grads = [p.grad is not None for n, p in model.named_parameters() if ".mlp.experts." in n]
    assert any(expert_grads) and not all(expert_grads)


def test_lora_on_attention_and_expert_projections(ref):
    peft = pytest.importorskip("peft")
    model = load()
    config = peft.LoraConfig(
        r=4, lora_alpha=8, init_lora_weights=False,
        target_modules=r".*\.(attention\.(query_key_value|dense)|mlp\.experts\.\d+\.(gate|up|down)_proj)",
    )  # fmt: skip
    lora = peft.get_peft_model(model, config)
    names = [n for n, _ in lora.named_parameters() if "lora_A" in n]
    assert any("attention.query_key_value" in n for n in names) and any("attention.dense" in n for n in names)
    assert any("mlp.experts.7.down_proj" in n for n in names)
    assert not any("shared_experts" in n or "mlp.gate." in n or "layers.0.mlp" in n for n in names)
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    logits = lora(input_ids=ref["fwd_input_ids"]).logits
    assert (logits - ref["fwd_logits_block"]).abs().max() > 1e-3  # the adapters change the output
    logits.logsumexp(-1).mean().backward()
    assert lora.base_model.model.model.layers[1].attention.dense.lora_A["default"].weight.grad.abs().sum() > 0


def test_config_rejects_behaviour_it_does_not_compute():
    with pytest.raises(ValueError, match="score_function='softmax'"):
        LLaDA2MoeConfig(score_function="softmax")
    with pytest.raises(ValueError, match="rope_scaling"):
        LLaDA2MoeConfig(rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="n_group=3"):
        LLaDA2MoeConfig(num_experts=8, n_group=3, topk_group=1, num_experts_per_tok=2)
    with pytest.raises(ValueError, match="block_size=0"):
        LLaDA2MoeConfig(block_size=0)
    with pytest.raises(ValueError, match="mask_token_id=200"):
        LLaDA2MoeConfig(vocab_size=128, mask_token_id=200, pad_token_id=0)


def test_every_recorded_generate_step_logit(ref):
    """The block logits LLaDA2's generate saw at each step = a block-causal forward of the canvas before that step,
    cut at the step's window (the original recomputes the window each step)."""
    meta = json.loads((FIXTURE / "reference.json").read_text())["gen"]
    model = load()
    runs = [run for run, info in meta.items() if info["logits_saved"]]
    assert len(runs) >= 10
    for run in runs:
        block = meta[run]["kwargs"]["block_length"]
        model.config.block_size = block
        prompt, canvas, windows = ref[f"gen_prompt{run[-1]}"], ref[f"{run}_canvas"], ref[f"{run}_window"]
        start = torch.cat([prompt, torch.full((canvas.shape[1] - len(prompt),), 123)])
        before = torch.cat([start[None], canvas[:-1]])  # (S, T): the canvas each step's forward read
        for step, end in enumerate(windows.tolist()):
            with torch.no_grad():
                logits = model(input_ids=before[step, :end][None]).logits[0, -block:]
            torch.testing.assert_close(logits, ref[f"{run}_logits"][step], atol=ATOL, rtol=0)
