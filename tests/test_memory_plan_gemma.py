"""The memory planner's DiffusionGemma layout: parameter and LoRA counts against instantiated tiny models and peft,
the transient terms by hand, and scripts/plan.py on a DiffusionGemma config folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import stabledrl_trl.diffusion.family  # noqa: F401  (registers the families before the DiffusionGemma module)
from stabledrl_trl.diffusion.families.diffusion_gemma import LORA_EXPERT_PARAMETERS, LORA_TARGET_MODULES
from stabledrl_trl.memory_plan import PlanSettings, estimate, shape_from_config_json
from stabledrl_trl.memory_plan_gemma import DiffusionGemmaShape
from stabledrl_trl.tiny import tiny_diffusion_gemma_config

# every width distinct, so that a swapped dimension changes the count
SHAPES = [
    {},
    {"hidden_size": 24, "intermediate_size": 40, "moe_intermediate_size": 20, "num_experts": 3, "head_dim": 8,
     "global_head_dim": 12, "num_attention_heads": 3, "num_key_value_heads": 1, "num_global_key_value_heads": 1,
     "num_hidden_layers": 3, "layer_types": ["sliding_attention", "full_attention", "full_attention"]},
]  # fmt: skip


def build(overrides):
    from transformers import DiffusionGemmaForBlockDiffusion

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return DiffusionGemmaForBlockDiffusion(tiny_diffusion_gemma_config(**overrides))


@pytest.mark.parametrize("overrides", SHAPES)
def test_parameter_count_equals_an_instantiated_model(overrides):
    model = build(overrides)
    shape = shape_from_config_json(model.config.to_dict(), source="tiny")
    assert isinstance(shape, DiffusionGemmaShape)
    assert shape.num_parameters() == model.num_parameters()  # tied weights counted once
    vision = sum(p.numel() for n, p in model.named_parameters() if "vision" in n)
    assert shape.vision_parameters == vision > 0
    layer = max(
        sum(p.numel() for n, p in model.named_parameters() if f"encoder.language_model.layers.{i}." in n)
        for i in range(model.config.text_config.num_hidden_layers)
    )
    assert shape.layer_parameters() == layer


@pytest.mark.parametrize("overrides", SHAPES)
def test_lora_count_equals_peft(overrides):
    from peft import LoraConfig, get_peft_model

    attention_only = r"model\.decoder\.layers\.\d+\.self_attn\.[qk]_proj"
    for targets, params in [(LORA_TARGET_MODULES, list(LORA_EXPERT_PARAMETERS)), (attention_only, None)]:
        model = build(overrides)
        config = LoraConfig(r=4, target_modules=targets, target_parameters=params)
        peft_model = get_peft_model(model, config)
        trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        shape = shape_from_config_json(model.config.to_dict())
        assert shape.lora_parameters(4, targets, params) == trained > 0
    with pytest.raises(ValueError, match="lora_target_modules=\\['q_proj'\\]: the DiffusionGemma memory plan"):
        shape.lora_parameters(4, ["q_proj"])


def test_transients_by_hand():
    # d 32, I 64, 2 experts of 32 active, V 104, C 8, 2 layers (sliding: 1 KV head x 16; full: 1 x 16), window 4
    shape = shape_from_config_json(tiny_diffusion_gemma_config(sliding_window=4).to_dict())
    s = PlanSettings(bf16=False, per_device_train_batch_size=2, mc_samples=3, max_prompt_length=6,
                     max_completion_length=8, gradient_checkpointing=True, overhead_bytes=0)  # fmt: skip
    c = estimate(shape, s)
    b, L, a = 4, 14, 10 * 32 + 4 * (64 + 2 * 32)
    enc = 2 * (2 * L) * a * b  # n_layers B L a b: the encoder is never checkpointed
    dec = 2 * (2 * 3 * 8) * 32 * b + (2 * 3 * 8) * a * b  # checkpointed decoder over B K C tokens
    assert c["activations"] == enc + dec
    assert c["estimator_logits"] == 2 * 3 * 8 * 104 * (4 + 12)
    assert c["rollout_logits"] == 2 * 8 * 104 * (4 + 4) + 2 * 8 * 104 * 4
    assert c["rollout_kv_cache"] == 2 * 1 * 16 * 2 * 4 * b + 2 * 1 * 16 * 2 * L * b  # sliding keeps 4 positions
    assert c["rollout_activations"] == 2 * L * (4 * 32 + 2 * 128) * b
    P = shape.num_parameters()
    assert c["weights"] == P * 4 and c["optimizer"] == 2 * P * 4
    train = c["activations"] + c["estimator_logits"]
    rollout = c["rollout_activations"] + c["rollout_logits"] + c["rollout_kv_cache"]
    assert c["peak"] == 4 * P * 4 + max(train, rollout)


def test_plan_script_on_a_diffusion_gemma_folder(tmp_path, load_script, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tiny_diffusion_gemma_config().to_dict()))
    plan = load_script("plan")
    config = Path(__file__).resolve().parent.parent / "configs" / "diffusion_gemma_gsm8k_lora.yaml"
    components = plan.main(["--config", str(config), "--model", str(folder),
                            "--gpu-memory", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert "0.00B parameters" in out and "LoRA r 16" in out and "peak (" in out
    shape = shape_from_config_json(tiny_diffusion_gemma_config().to_dict())
    assert components["lora"] == shape.lora_parameters(16, LORA_TARGET_MODULES, LORA_EXPERT_PARAMETERS) * 16
    assert components["weights"] == shape.num_parameters() * 2  # bf16, frozen base


def test_hub_id_without_config_says_how_to_plan_it():
    from stabledrl_trl.memory_plan import resolve_shape

    with pytest.raises(ValueError, match="config.json --local-dir <folder>`\\) and pass --model <folder>"):
        resolve_shape("google/diffusiongemma-26B-A4B-it-not-cached")


def test_26b_a4b_known_without_its_config_json():
    """google/diffusiongemma-26B-A4B-it plans without a download: its published text geometry counted by the planner
    equals transformers' model built from it on the meta device, and the total is the checkpoint's weight count."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    from stabledrl_trl.memory_plan import resolve_shape
    from stabledrl_trl.memory_plan_gemma import DIFFUSION_GEMMA_26B_A4B, shape_from_gemma_config

    config = {k: v for k, v in DIFFUSION_GEMMA_26B_A4B.items() if k != "model_type"}
    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(**config))
    instantiated = sum(p.numel() for p in model.parameters())  # tied weights (encoder = decoder, head) once
    published = shape_from_gemma_config(DIFFUSION_GEMMA_26B_A4B)
    assert published.num_parameters() == instantiated
    text = published.num_parameters() - published.vision_parameters
    assert 25.2e9 <= text < 25.3e9  # the model card's 25.2B
    shape = resolve_shape("google/diffusiongemma-26B-A4B-it")
    assert shape.num_parameters() == 25_823_850_512 == 51_647_701_024 // 2
    assert shape.n_experts == 128 and shape.active_experts == 8 and shape.canvas_length == 256
    assert shape.layer_types.count("full_attention") == 5 and shape.sliding_window == 1024


def test_advice_for_gemma_never_names_estimator_chunk_size():
    """estimator_chunk_size is refused for DiffusionGemma, so the planner's advice offers smaller micro-batches."""
    from stabledrl_trl.memory_plan import advice, resolve_shape

    shape = resolve_shape("google/diffusiongemma-26B-A4B-it")
    settings = PlanSettings(gpus=1, bf16=True, use_peft=True, gradient_checkpointing=True,
                            per_device_train_batch_size=8, max_completion_length=512, mc_samples=2,
                            lora_target_modules=LORA_TARGET_MODULES)  # fmt: skip
    components = estimate(shape, settings)
    tips = advice(shape, settings, components, gpu_bytes=40 * 2**30)
    assert tips and not any("estimator_chunk_size" in t for t in tips)
    assert any("smaller per_device_train_batch_size" in t and "mc_samples" in t for t in tips), tips
