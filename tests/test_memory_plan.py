"""The memory planner (stabledrl_trl.memory_plan): parameter counts against real models, components against hand
computation, the known hub shapes against their published sizes, and its errors."""

import json
import os

import pytest

from stabledrl_trl.memory_plan import (
    GIB,
    KNOWN_MODELS,
    ModelShape,
    PlanSettings,
    advice,
    estimate,
    resolve_shape,
    settings_from_config,
    shape_from_config_json,
)

HERE = os.path.dirname(os.path.abspath(__file__))
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameter_count_equals_a_built_llada_and_sdar():
    from transformers import AutoConfig, AutoModelForCausalLM

    from stabledrl_trl.tiny import tiny_llada_config_dict, tiny_sdar_config_dict

    llada = tiny_llada_config_dict(d_model=48, n_layers=3, n_heads=4, n_kv_heads=2, mlp_hidden_size=80)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**llada))
    assert shape_from_config_json(llada).num_parameters() == _count(model)

    sdar = tiny_sdar_config_dict(num_key_value_heads=2)
    model_type = sdar.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **sdar))
    shape = shape_from_config_json({**sdar, "model_type": model_type})
    assert shape.qk_norm and shape.block_diffusion
    assert shape.num_parameters() == _count(model)


def test_lora_parameter_count_equals_peft():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from stabledrl_trl.tiny import tiny_llada_config_dict

    cfg = tiny_llada_config_dict(d_model=48, n_layers=3, n_heads=4, n_kv_heads=2, mlp_hidden_size=80)
    model = get_peft_model(AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)),
                           LoraConfig(r=8, target_modules=LORA_TARGETS))  # fmt: skip
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert shape_from_config_json(cfg).lora_parameters(8, LORA_TARGETS) == trainable


def test_moe_parameter_count_by_hand():
    shape = ModelShape(8, 3, 2, 1, 12, 10, head_dim=4, n_experts=4, active_experts=2, shared_experts=1,
                       moe_intermediate=3, dense_layers=1, qk_norm=True)  # fmt: skip
    attention = 8 * 8 + 2 * 8 * 4 + 8 * 8 + 2 * 4  # q, k, v, o, q/k norms
    dense = 3 * 8 * 12
    moe = (4 + 1) * 3 * 8 * 3 + 4 * 8  # routed + shared experts, router
    layers = 3 * (attention + 2 * 8) + dense + 2 * moe
    assert shape.num_parameters() == layers + 2 * 10 * 8 + 8
    assert shape.active_intermediate() == 12  # max(dense 12, (2 + 1) * 3 = 9)


def test_known_models_have_their_published_sizes():
    billions = {k: v.num_parameters() / 1e9 for k, v in KNOWN_MODELS.items()}
    assert billions["GSAI-ML/LLaDA-8B-Instruct"] == pytest.approx(8.0, rel=0.02)
    assert billions["Dream-org/Dream-v0-Instruct-7B"] == pytest.approx(7.6, rel=0.02)  # Qwen2.5-7B: 7.6B
    assert billions["JetLM/SDAR-8B-Chat"] == pytest.approx(8.2, rel=0.03)  # Qwen3-8B: 8.2B
    assert billions["inclusionAI/LLaDA2.0-mini"] == pytest.approx(16.0, rel=0.03)  # 16B total (REFERENCE 13)
    assert KNOWN_MODELS["Gen-Verse/TraDo-4B-Instruct"] is KNOWN_MODELS["JetLM/SDAR-4B-Chat"]
    for shape in KNOWN_MODELS.values():
        assert shape.source


def test_components_by_hand_ddp_float32():
    shape = ModelShape(hidden=16, n_layers=2, n_heads=2, n_kv_heads=2, intermediate=32, vocab=50)
    P = shape.num_parameters()
    assert P == 2 * (4 * 16 * 16 + 3 * 16 * 32 + 2 * 16) + 2 * 50 * 16 + 16
    s = PlanSettings(gpus=1, sharding="ddp", bf16=False, gradient_checkpointing=False, per_device_train_batch_size=4,
                     mc_samples=2, estimator_chunk_size=3, max_prompt_length=10, max_completion_length=6,
                     block_length=3, overhead_bytes=0)  # fmt: skip
    c = estimate(shape, s)
    assert (c["weights"], c["gradients"], c["optimizer"], c["lora"]) == (4 * P, 4 * P, 8 * P, 0)
    T = 3 * 16  # chunk of 3 rows (of B K = 8) x (10 + 6) tokens
    assert c["activations"] == 2 * T * (10 * 16 + 4 * 32) * 4
    assert c["estimator_logits"] == 3 * 6 * 50 * 16  # rows x C x V x (4 + 12)
    assert c["rollout_activations"] == 4 * 16 * (4 * 16 + 2 * 32) * 4
    assert c["rollout_logits"] == 4 * 3 * 50 * 8  # R x block x V x (logits + softmax), float32: no copy
    assert c["rollout_kv_cache"] == 0
    train = c["activations"] + c["estimator_logits"]
    rollout = c["rollout_activations"] + c["rollout_logits"]
    assert c["peak"] == 16 * P + max(train, rollout)

    gc = estimate(shape, PlanSettings(**{**s.__dict__, "gradient_checkpointing": True}))
    assert gc["activations"] == 2 * T * 16 * 4 + T * (10 * 16 + 4 * 32) * 4
    cached = estimate(shape, PlanSettings(**{**s.__dict__, "rollout_cache": "dual"}))
    assert cached["rollout_kv_cache"] == 2 * 2 * 2 * 8 * 4 * 16 * 4  # 2 (K, V) x layers x kv heads x hd x R x L x b


def test_sharding_divides_the_persistent_state():
    shape = KNOWN_MODELS["GSAI-ML/LLaDA-8B-Instruct"]
    P = shape.num_parameters()
    base = dict(gpus=8, bf16=True, overhead_bytes=0)
    zero3 = estimate(shape, PlanSettings(sharding="zero3", **base))
    assert (zero3["weights"], zero3["gradients"], zero3["optimizer"]) == (2 * P / 8, 4 * P / 8, 12 * P / 8)
    assert zero3["rollout_gathered_weights"] == 2 * P - 2 * P / 8  # rollouts gather the full bf16 weights
    zero2 = estimate(shape, PlanSettings(sharding="zero2", **base))
    assert (zero2["weights"], zero2["gradients"], zero2["optimizer"]) == (2 * P, 4 * P / 8, 12 * P / 8)
    fsdp = estimate(shape, PlanSettings(sharding="fsdp", **base))
    assert (fsdp["weights"], fsdp["gradients"], fsdp["optimizer"]) == (4 * P / 8, 4 * P / 8, 8 * P / 8)
    ddp = estimate(shape, PlanSettings(sharding="ddp", **base))
    assert (ddp["weights"], ddp["gradients"], ddp["optimizer"]) == (2 * P, 2 * P, 4 * P)
    lora = estimate(shape, PlanSettings(sharding="ddp", use_peft=True, lora_r=128, lora_target_modules=LORA_TARGETS,
                                        **base))  # fmt: skip
    per_layer = 128 * (4 * (4096 + 4096) + 3 * (4096 + 12288))
    assert (lora["gradients"], lora["optimizer"], lora["lora"]) == (0, 0, 32 * per_layer * 16)


def test_bf16_logits_add_a_float32_copy():
    shape = ModelShape(hidden=16, n_layers=2, n_heads=2, n_kv_heads=2, intermediate=32, vocab=50)
    s = PlanSettings(bf16=True, per_device_train_batch_size=2, mc_samples=1, estimator_chunk_size=2,
                     max_prompt_length=4, max_completion_length=6, block_length=3, overhead_bytes=0)  # fmt: skip
    c = estimate(shape, s)
    assert c["estimator_logits"] == 2 * 6 * 50 * (2 + 4 + 12)
    assert c["rollout_logits"] == 2 * 3 * 50 * (2 + 4 + 4)


def test_block_diffusion_doubles_the_estimator_length_and_caches_rollouts():
    shape = KNOWN_MODELS["JetLM/SDAR-4B-Chat"]
    s = PlanSettings(per_device_train_batch_size=2, mc_samples=1, estimator_chunk_size=1, max_prompt_length=8,
                     max_completion_length=8, gradient_checkpointing=True, overhead_bytes=0)  # fmt: skip
    c = estimate(shape, s)
    T = 1 * 2 * 16  # one row of the [noisy || clean] layout
    assert c["activations"] == 36 * T * 2560 * 2 + T * (10 * 2560 + 4 * 9728) * 2
    assert c["rollout_kv_cache"] == 2 * 36 * 8 * 128 * 2 * 16 * 2


def test_advice_when_it_does_not_fit():
    shape = KNOWN_MODELS["GSAI-ML/LLaDA-8B-Instruct"]
    s = PlanSettings(gpus=1, sharding="ddp", bf16=True, gradient_checkpointing=False)
    c = estimate(shape, s)
    assert c["peak"] > 80 * GIB
    tips = advice(shape, s, c, 80 * GIB)
    assert any("zero3 or fsdp" in t for t in tips) and any("LoRA" in t or "gradient_checkpointing" in t for t in tips)
    small = PlanSettings(gpus=8, sharding="fsdp", use_peft=True, lora_target_modules=LORA_TARGETS)
    assert advice(shape, small, estimate(shape, small), 80 * GIB) == []


def test_settings_from_config_and_errors(tmp_path):
    s = settings_from_config({"dtype": "bfloat16", "per_device_train_batch_size": 16, "gradient_accumulation_steps": 4,
                              "use_peft": True, "lora_r": 32, "estimator_chunk_size": 8}, gpus=8)  # fmt: skip
    assert (s.sharding, s.bf16, s.steps_per_generation, s.lora_r, s.estimator_chunk_size) == ("fsdp", True, 4, 32, 8)
    assert settings_from_config({}, gpus=1).sharding == "ddp"
    with pytest.raises(ValueError, match="sharding='zero4'"):
        PlanSettings(sharding="zero4")
    with pytest.raises(ValueError, match="not a known hub id"):
        resolve_shape("someone/unknown-model")
    folder = tmp_path / "model"
    folder.mkdir()
    with open(os.path.join(HERE, "fixtures", "llada-tiny", "config.json")) as f:
        config = json.load(f)
    (folder / "config.json").write_text(json.dumps(config))
    shape = resolve_shape(str(folder))
    assert (shape.hidden, shape.n_layers) == (config["d_model"], config["n_layers"])


def test_lora_targets_as_a_peft_regex_count_the_modules_it_matches():
    """PEFT takes lora_target_modules as a regex string too (matched against full module names): the planner counts
    the projections it matches, as for the same names given as a list."""
    from stabledrl_trl.memory_plan import KNOWN_MODELS

    shape = KNOWN_MODELS["GSAI-ML/LLaDA-8B-Instruct"]
    r = 16
    by_list = shape.lora_parameters(r, ["q_proj", "v_proj"])
    assert by_list == r * (4096 + 4096) * 2 * 32  # q (d -> d) and v (d -> kv = d) in each of 32 layers
    assert shape.lora_parameters(r, r".*\.(q_proj|v_proj)") == by_list
    assert shape.lora_parameters(r, r"model\.layers\.\d+\.mlp\.(gate|up)_proj") == r * (4096 + 12288) * 2 * 32
