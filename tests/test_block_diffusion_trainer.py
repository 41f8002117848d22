"""StableDRLTrainer on a tiny SDAR and a tiny LLaDA2 (block diffusion, LLaDA2 with experts): the block families'
samplers and staircase estimator are used, every objective trains, LoRA trains adapters only, both mask-seed modes
work, MoE routing is logged."""

import pytest
import torch
from tiny_run import digit_reward, make_dataset, params_copy, tiny_args

from stabledrl_trl import StableDRLTrainer
from stabledrl_trl.diffusion.families import block_causal as family_module  # the block families call these
from stabledrl_trl.diffusion.family import detect_family
from stabledrl_trl.stabledrl_config import TRL_LOSS_TYPES
from stabledrl_trl.stabledrl_trainer import expert_load_entropy
from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada2_config_dict, tiny_sdar_config_dict


def make_sdar(seed=0, **overrides):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**tiny_sdar_config_dict(**overrides))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)


def make_args(tmp_path, **kw):
    base = dict(gradient_accumulation_steps=1, max_completion_length=8, max_steps=2, learning_rate=1e-3, logging_steps=1, save_strategy="no",
                seed=7, temperature=1.0, likelihood_estimator="mc_elbo", mc_samples=2)  # fmt: skip
    return tiny_args(tmp_path, **{**base, **kw})


@pytest.mark.parametrize(
    "loss_type, mask_seed_mode", [("stable_drl", "fresh"), ("stable_drl", "shared"), ("stable_drl_ratio", "fresh"),
                                  ("dgpo", "shared"), ("grpo_sequence", "fresh"), ("dapo", "shared")]
)  # fmt: skip
def test_sdar_trains_with_block_sampler_and_staircase_estimates(tmp_path, count_calls, loss_type, mask_seed_mode):
    model = make_sdar()
    assert detect_family(model) == "sdar"
    calls = count_calls(family_module, "block_generate", "staircase_estimate")
    # TRL's grpo on fresh masks: at sequence level (per-token ratios on fresh random masks are refused)
    extra = dict(loss_type="grpo", importance_sampling_level="sequence") if loss_type == "grpo_sequence" else {}
    trainer = StableDRLTrainer(model=model, reward_funcs=digit_reward,
                               args=make_args(tmp_path, **{"loss_type": loss_type, "mask_seed_mode": mask_seed_mode, **extra}),
                               train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip
    assert trainer.is_diffusion and trainer._diffusion_family.name == "sdar"
    before = params_copy(trainer.model)
    trainer.train()
    assert calls["block_generate"] >= 2 and calls["staircase_estimate"] >= 2, calls
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)


def test_sdar_official_objective_with_spg_sandwich(tmp_path):
    """The official StableDRL estimator (block-random masks, SPG sandwich for negative advantages) on SDAR."""
    args = make_args(tmp_path, likelihood_estimator="block_random", estimator_block_size=4, sandwich=True,
                     p_mask_prompt=0.15)  # fmt: skip
    trainer = StableDRLTrainer(model=make_sdar(), reward_funcs=digit_reward, args=args, train_dataset=make_dataset(),
                               processing_class=build_tiny_tokenizer())  # fmt: skip
    before = params_copy(trainer.model)
    trainer.train()
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_sdar_lora_shared_masks_start_on_policy(tmp_path):
    """LoRA on SDAR with d1's recipe: shared masks make iteration 0's KL to the adapter-free reference exactly 0."""
    from peft import LoraConfig

    args = make_args(tmp_path, loss_type="grpo", likelihood_estimator="mean_field", mc_samples=1,
                     mask_seed_mode="shared", beta=0.04, num_iterations=2, block_remasking="low_confidence_static",
                     top_k=20, top_p=0.95)  # fmt: skip
    trainer = StableDRLTrainer(model=make_sdar(), reward_funcs=digit_reward, args=args, train_dataset=make_dataset(),
                               processing_class=build_tiny_tokenizer(),
                               peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    before = params_copy(trainer.model)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert all(torch.equal(after[n], before[n]) for n in before if "lora_" not in n)
    assert any(not torch.equal(after[n], before[n]) for n in before if "lora_B" in n)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[0]["kl"] == pytest.approx(0.0, abs=1e-6)


def test_block_steps_beyond_the_models_block_are_refused(tmp_path):
    with pytest.raises(ValueError, match="block_denoising_steps=8 exceeds the model's block size 4"):
        StableDRLTrainer(model=make_sdar(), reward_funcs=digit_reward, args=make_args(tmp_path, block_denoising_steps=8),
                         train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip



@pytest.mark.parametrize("layout", [dict(block_length=4), dict(diffusion_steps=8), dict(block_length=2, diffusion_steps=4)])
def test_llada_layout_set_for_a_block_diffusion_model_is_refused_not_ignored(tmp_path, layout):
    """block_length / diffusion_steps drive LLaDA's sampler only; set for SDAR they would be ignored. Left unset (the
    values max_completion_length derives: 8 positions -> one block of 8, 4 steps) they are accepted."""
    with pytest.raises(ValueError, match="which sdar models do not use"):
        StableDRLTrainer(model=make_sdar(), reward_funcs=digit_reward, args=make_args(tmp_path, **layout),
                         train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip
    args = make_args(tmp_path)
    assert (args.block_length, args.diffusion_steps) == (8, 4)

@pytest.mark.parametrize(
    "field, value, match",
    [("block_remasking", "random", "block_remasking"), ("block_confidence_threshold", 1.5, "block_confidence"),
     ("block_denoising_steps", 0, "block_denoising_steps"), ("top_p", 0.0, "top_p")],
)  # fmt: skip
def test_bad_block_fields_fail_at_construction(tmp_path, field, value, match):
    with pytest.raises(ValueError, match=match):
        make_args(tmp_path, **{field: value})


def test_masked_eos_tail_is_refused_for_block_diffusion(tmp_path):
    with pytest.raises(ValueError, match="eos_tail='masked'.*SDAR"):
        StableDRLTrainer(model=make_sdar(), reward_funcs=digit_reward, args=make_args(tmp_path, eos_tail="masked"),
                         train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip


@pytest.mark.parametrize("architecture", ["sdar", pytest.param("llada2", marks=pytest.mark.slow)])
def test_block_resumed_run_replays_exactly(tmp_path, architecture):
    """Train 4 steps saving at 2; a new trainer resumed from checkpoint-2 logs the same steps 3-4 (rollout noise and
    mask seeds derive from the seed and the step; the checkpoint holds the original config keys and weight names)."""
    import json

    make, model_type = (make_sdar, "sdar") if architecture == "sdar" else (make_llada2, "llada2_moe")

    def trainer_for(out):
        args = make_args(tmp_path, output_dir=str(out), max_steps=4, save_strategy="steps", save_steps=2,
                         mask_seed_mode="fresh", num_iterations=2)  # fmt: skip
        return StableDRLTrainer(model=make(seed=3), reward_funcs=digit_reward, args=args,
                                train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip

    full = trainer_for(tmp_path / "full")
    full.train()
    saved = json.loads((tmp_path / "full" / "checkpoint-2" / "config.json").read_text())
    assert saved["model_type"] == model_type and "rope_theta" in saved and saved["block_size"] == 4
    resumed = trainer_for(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))

    def logs(trainer):
        return {h["step"]: h for h in trainer.state.log_history if "loss" in h}

    expected, got = logs(full), logs(resumed)
    assert "reward" in expected[3] and "stabledrl/weight_mean" in expected[4]
    for step in (3, 4):
        keys = [k for k in ("loss", "reward", "stabledrl/weight_mean", "grad_norm") if k in expected[step]]
        assert set(keys) <= set(got[step])
        for key in keys:
            assert got[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)


def test_block_fields_are_refused_for_a_full_attention_model(tmp_path):
    """block_* fields would be ignored by LLaDA's sampler: the trainer refuses them with the fix."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from stabledrl_trl.tiny import tiny_llada_config_dict

    llada = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llada_config_dict()))
    with pytest.raises(ValueError, match="block_remasking.*block-diffusion sampler"):
        StableDRLTrainer(model=llada, reward_funcs=digit_reward,
                         args=make_args(tmp_path, block_remasking="low_confidence_static"),
                         train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip


# ----------------------------------------------------------------------------------------------------- LLaDA2 (MoE)


def make_llada2(seed=0, **overrides):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**tiny_llada2_config_dict(**overrides))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)


LLADA2_RUNS = [
    ("stable_drl", "fresh", {}),
    ("stable_drl", "shared", {}),
    ("stable_drl_ratio", "fresh", {}),
    ("dgpo", "shared", {}),
    ("grpo", "fresh", {"importance_sampling_level": "sequence"}),
]
LLADA2_RUNS += [(loss, "shared", {}) for loss in TRL_LOSS_TYPES]  # fmt: skip


@pytest.mark.parametrize("loss_type, mask_seed_mode, extra", LLADA2_RUNS)
def test_llada2_trains_with_every_loss_type(tmp_path, count_calls, loss_type, mask_seed_mode, extra):
    """LLaDA2 (MoE) through the llada2 family: its rollouts and staircase estimates, one optimiser step per loss."""
    model = make_llada2()
    assert detect_family(model) == "llada2"
    calls = count_calls(family_module, "block_generate", "staircase_estimate")
    args = make_args(tmp_path, loss_type=loss_type, mask_seed_mode=mask_seed_mode, max_steps=1, **extra)
    trainer = StableDRLTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=make_dataset(),
                               processing_class=build_tiny_tokenizer())  # fmt: skip
    assert trainer._diffusion_family.name == "llada2"
    before = params_copy(trainer.model)
    trainer.train()
    assert calls["block_generate"] >= 1 and calls["staircase_estimate"] >= 1, calls
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 1 and torch.isfinite(torch.tensor(logs[0]["loss"]))
    assert 0.0 < logs[0]["moe/expert_load_entropy_min"] <= logs[0]["moe/expert_load_entropy"] <= 1.0


@pytest.mark.slow
def test_llada2_lora_on_attention_and_experts_with_checkpointing(tmp_path):
    """LoRA on the fused attention and the routed experts' projections, gradient checkpointing on: only adapters
    change, and the gradient-checkpointed loss equals the plain one."""
    from peft import LoraConfig

    targets = r".*\.(attention\.(query_key_value|dense)|mlp\.experts\.\d+\.(gate|up|down)_proj)"
    losses = []
    for checkpointing in (False, True):
        args = make_args(tmp_path, loss_type="stable_drl", mask_seed_mode="shared", gradient_checkpointing=checkpointing,
                         learning_rate=1e-2)  # fmt: skip
        trainer = StableDRLTrainer(model=make_llada2(seed=1), reward_funcs=digit_reward, args=args,
                                   train_dataset=make_dataset(), processing_class=build_tiny_tokenizer(),
                                   peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=targets))  # fmt: skip
        before = params_copy(trainer.model)
        trainer.train()
        after = dict(trainer.model.named_parameters())
        assert all(torch.equal(after[n], before[n]) for n in before if "lora_" not in n)
        changed = [n for n in before if "lora_B" in n and not torch.equal(after[n], before[n])]
        assert any("query_key_value" in n for n in changed) and any(".experts." in n for n in changed)
        losses.append([h["loss"] for h in trainer.state.log_history if "loss" in h])
    assert losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-6)


def test_expert_load_entropy_by_hand():
    """1 = uniform load, 0 = one expert takes every token; counts are reset after reading; no routers: nothing."""
    model = make_llada2()
    gates = [layer.mlp.gate for layer in model.model.layers[1:]]
    gates[0].expert_load.copy_(torch.tensor([5.0, 5, 5, 5, 5, 5, 5, 5]))
    gates[1].expert_load.copy_(torch.tensor([0.0, 0, 6, 0, 0, 0, 0, 2]))
    p = torch.tensor([0.75, 0.25])
    collapsed = float(-(p * p.log()).sum() / torch.log(torch.tensor(8.0)))
    stats = expert_load_entropy(model)
    assert stats["moe/expert_load_entropy"] == pytest.approx((1.0 + collapsed) / 2)
    assert stats["moe/expert_load_entropy_min"] == pytest.approx(collapsed)
    assert all(g.expert_load.sum() == 0 for g in gates)
    assert expert_load_entropy(make_sdar()) == {}


def test_expert_load_entropy_is_that_of_every_process_load():
    """Under data parallelism the counts are summed over processes first: two processes that each route every token
    to one (different) expert have a balanced load together, not a collapsed one."""
    model = make_llada2()
    gates = [layer.mlp.gate for layer in model.model.layers[1:]]
    here = [torch.tensor([4.0, 0, 0, 0, 0, 0, 0, 0]), torch.tensor([0.0, 0, 3, 0, 0, 0, 0, 0])]
    there = torch.cat([torch.tensor([0.0, 4, 0, 0, 0, 0, 0, 0]), torch.tensor([0.0, 0, 0, 0, 0, 0, 0, 1])]).double()
    for gate, load in zip(gates, here):
        gate.expert_load.copy_(load)
    calls = []

    def reduce(counts):  # what accelerate's reduce(..., "sum") returns with a second process holding `there`
        calls.append(counts.shape)
        return counts + there

    stats = expert_load_entropy(model, reduce)
    log8 = torch.log(torch.tensor(8.0))
    balanced = float(torch.log(torch.tensor(2.0)) / log8)  # [4, 4]: two experts equally
    p = torch.tensor([0.75, 0.25])
    skewed = float(-(p * p.log()).sum() / log8)  # [3, 1]
    assert calls == [(16,)]  # one call for every router's counts
    assert stats["moe/expert_load_entropy"] == pytest.approx((balanced + skewed) / 2)
    assert stats["moe/expert_load_entropy_min"] == pytest.approx(skewed)
    assert expert_load_entropy(model, reduce) != stats  # counts were reset: now only the other process's load
