"""Every GRPOConfig field is honoured, refused where it cannot apply, or documented as unused (`trl_fields`).

The classification test reads the installed TRL's `GRPOConfig` dataclass fields, so a TRL upgrade that adds a field
fails here until the field is classified. Each refusal is tested for its message (field, value, fix) and for being
conditional; each field the package re-implements is tested for changing what it should.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from test_reliability import digit_reward, make_args, make_dataset, make_llada, make_trainer
from trl import GRPOConfig

from stabledrl_trl import StableDRLConfig, StableDRLTrainer
from stabledrl_trl.objectives import ObjectiveOutput, add_kl_penalty, own_loss_types
from stabledrl_trl.tiny import build_tiny_tokenizer
from stabledrl_trl.trl_fields import HONOURED, REFUSED, REFUSED_DIFFUSION, UNUSED, refused_loss_types

TESTS = Path(__file__).parent

# ------------------------------------------------------------------------------------------ the classification


def test_every_grpo_config_field_is_in_exactly_one_class():
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    classes = {"HONOURED": set(HONOURED), "REFUSED": set(REFUSED), "UNUSED": set(UNUSED)}
    unclassified = fields - set().union(*classes.values())
    assert not unclassified, f"classify these GRPOConfig fields in stabledrl_trl/trl_fields.py: {sorted(unclassified)}"
    for a, b in (("HONOURED", "REFUSED"), ("HONOURED", "UNUSED"), ("REFUSED", "UNUSED")):
        assert not classes[a] & classes[b], (a, b, classes[a] & classes[b])
    stale = set().union(*classes.values()) - fields
    assert not stale, f"not GRPOConfig fields (any more): {sorted(stale)}"
    assert set(REFUSED_DIFFUSION) <= set(REFUSED)
    assert all(reason.strip() for reason in UNUSED.values())


def test_fields_reimplemented_here_name_a_test_that_exists():
    for name, how in HONOURED.items():
        assert how in ("trl", "transformers") or how.startswith("here: "), (name, how)
        if how.startswith("here: "):
            file, _, test = how[len("here: ") :].partition("::")
            source = (TESTS / file).read_text()
            assert re.search(rf"^def {test}\(", source, re.M), (name, how)


# -------------------------------------------------------------------------- refusals at config construction

# A value outside each field's neutral set, and (where one exists) a loss type that honours the field.
BAD_VALUES = {
    "entropy_coef": (0.1, "dapo"),
    "use_adaptive_entropy": (True, "dapo"),
    "top_entropy_quantile": (0.5, "dapo"),
    "off_policy_mask_threshold": (0.5, "dapo"),
    "epsilon": (0.3, "dapo"),
    "epsilon_high": (0.3, "dapo"),
    "delta": (2.0, "grpo"),
    "sapo_temperature_neg": (2.0, "sapo"),
    "sapo_temperature_pos": (2.0, "sapo"),
    "vespo_k_pos": (1.5, "vespo"),
    "vespo_lambda_pos": (1.5, "vespo"),
    "vespo_k_neg": (1.5, "vespo"),
    "vespo_lambda_neg": (1.5, "vespo"),
    "importance_sampling_level": ("sequence", "grpo"),
    "label_smoothing_factor": (0.1, None),
    "train_sampling_strategy": ("group_by_length", None),
}
CONFIG_REFUSALS = sorted(n for n, r in REFUSED.items() if r.when != "diffusion" and r.needs is None)


def config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                per_device_train_batch_size=4, num_generations=4, mask_seed_mode="shared")  # fmt: skip
    return StableDRLConfig(**{**base, **kw})


@pytest.mark.parametrize("name", CONFIG_REFUSALS)
def test_field_that_cannot_apply_to_the_loss_is_refused_at_construction(tmp_path, name):
    value, honouring_loss = BAD_VALUES[name]  # a KeyError here: give the new refusal a test value
    refusal = REFUSED[name]
    losses = refused_loss_types(name) or ("stable_drl",)
    for loss_type in losses:
        if loss_type == "luspo":  # TRL's luspo needs sequence-level ratios
            continue
        with pytest.raises(ValueError) as info:
            config(tmp_path, loss_type=loss_type, **{name: value})
        message = str(info.value)
        for word in (f"{name}={value!r}", "silently ignored", "Fix:"):
            assert word in message, (word, message)
        if refusal.when == "loss":
            assert f"loss_type={loss_type!r}" in message
    if honouring_loss is not None:  # conditional: the loss type that reads it accepts it
        extra = {"importance_sampling_level": "sequence"} if honouring_loss == "luspo" else {}
        assert getattr(config(tmp_path, loss_type=honouring_loss, **{name: value}, **extra), name) == value


def test_every_config_refusal_has_a_test_value():
    assert set(CONFIG_REFUSALS) <= set(BAD_VALUES)


def test_vllm_importance_correction_is_refused_for_the_packages_objectives(tmp_path, tiny_llama):
    args = config(tmp_path, use_vllm=True, diffusion=False)
    with pytest.raises(ValueError, match="vllm_importance_sampling_correction=True.*loss_type='stable_drl'.*Fix"):
        StableDRLTrainer(model=tiny_llama, reward_funcs=digit_reward, args=args, train_dataset=make_dataset(),
                         processing_class=build_tiny_tokenizer())  # fmt: skip


# ---------------------------------------------------------------------------- refusals for a diffusion model

DIFFUSION_VALUES = {
    "use_vllm": True,
    "use_transformers_continuous_batching": True,
    "cache_implementation": "static",
    "min_p": 0.1,
    "repetition_penalty": 1.2,
    "generation_kwargs": {"no_repeat_ngram_size": 2},
    "entropy_coef": 0.1,
    "use_adaptive_entropy": True,
}
DIFFUSION_REFUSALS = sorted({n for n, r in REFUSED.items() if r.when == "diffusion"} | set(REFUSED_DIFFUSION))


@pytest.mark.parametrize("name", DIFFUSION_REFUSALS)
def test_field_that_cannot_apply_to_a_diffusion_model_is_refused_by_the_trainer(tmp_path, name):
    value = DIFFUSION_VALUES[name]
    args = make_args(tmp_path, loss_type="dapo", mask_seed_mode="shared", **{name: value})  # a TRL loss
    with pytest.raises(ValueError) as info:
        make_trainer(tmp_path, args=args)
    message = str(info.value)
    for word in (f"{name}={value!r}", "masked-diffusion", "Fix:"):
        assert word in message, (word, message)


@pytest.mark.parametrize("as_path", [False, True])
def test_use_vllm_on_a_diffusion_model_is_refused_before_trls_vllm_setup(tmp_path, as_path):
    model = make_llada()
    if as_path:
        model.save_pretrained(tmp_path / "llada")
        build_tiny_tokenizer().save_pretrained(tmp_path / "llada")
        model = str(tmp_path / "llada")
    with pytest.raises(ValueError) as info:
        make_trainer(tmp_path, model=model, args=make_args(tmp_path, use_vllm=True))
    message = str(info.value)
    assert "use_vllm=True" in message and "does not run masked-diffusion sampling" in message
    assert "use_vllm=False" in message and "pip install" not in message


def test_entropy_bonus_is_honoured_for_an_autoregressive_model(tmp_path, tiny_llama):
    """TRL's entropy bonus applies to an autoregressive model with a TRL loss: the update changes with it."""

    def final_weights(coef):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = type(tiny_llama)(tiny_llama.config)
            model.load_state_dict(tiny_llama.state_dict())
        args = make_args(tmp_path, loss_type="dapo", mask_seed_mode="shared", entropy_coef=coef, max_steps=1,
                         max_completion_length=8)  # fmt: skip
        trainer = make_trainer(tmp_path, model=model, args=args)
        trainer.train()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    plain, bonus = final_weights(0.0), final_weights(1.0)
    assert any(not torch.equal(plain[n], bonus[n]) for n in plain)


# ------------------------------------------------------------------------ honoured fields, re-implemented here


def test_top_entropy_quantile_changes_a_diffusion_models_update_with_a_trl_loss(tmp_path):
    """With TRL's losses, top_entropy_quantile masks tokens by the estimator's entropies: the update changes."""

    def final_weights(quantile):
        args = make_args(tmp_path, loss_type="dapo", mask_seed_mode="shared", top_entropy_quantile=quantile,
                         max_steps=1)  # fmt: skip
        trainer = make_trainer(tmp_path, args=args)
        trainer.train()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    full, top = final_weights(1.0), final_weights(0.2)
    assert any(not torch.equal(full[n], top[n]) for n in full)


def test_kl_penalty_matches_a_hand_computation():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]])  # (B=2, T=3)
    ref = torch.tensor([[-1.5, -2.0, -0.1], [-0.3, -0.2, -1.0]])
    old = torch.tensor([[-1.2, -2.1, -0.5], [-0.3, -0.7, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    d = ref - logp
    kl = torch.exp(d) - d - 1  # k3, by hand
    # token level (dgpo): unit_t + beta * kl_t
    base = ObjectiveOutput(torch.zeros(2, 3), "token")
    out, got_kl = add_kl_penalty(base, logp, ref, mask, beta=0.5, group_size=2)
    torch.testing.assert_close(out.unit_loss, 0.5 * kl)
    torch.testing.assert_close(got_kl, kl)
    # group level: unit_g + beta * mean over the group of each sequence's masked-mean KL
    group = ObjectiveOutput(torch.tensor([1.0]), "group")
    out, _ = add_kl_penalty(group, logp, ref, mask, beta=0.5, group_size=2)
    seq = [(kl[0, 0] + kl[0, 1] + kl[0, 2]) / 3, (kl[1, 0] + kl[1, 1]) / 2]
    torch.testing.assert_close(out.unit_loss, torch.tensor([1.0 + 0.5 * (seq[0] + seq[1]) / 2]))
    # TRL's bias correction multiplies by the per-token ratio to the old policy
    out, got_kl = add_kl_penalty(base, logp, ref, mask, beta=1.0, group_size=2, old_per_token_logps=old)
    torch.testing.assert_close(got_kl, kl * torch.exp(logp - old))
    assert (kl >= 0).all()


@pytest.mark.parametrize("loss_type", own_loss_types())
def test_beta_adds_a_kl_term_to_the_packages_objectives(tmp_path, loss_type):
    """beta=0.04 with the default loss: the config picks shared masks (no mask mode chosen), the KL to the
    reference is logged and changes the update once the policy has moved away from the reference."""
    cfg = config(tmp_path, beta=0.04, mask_seed_mode=None)
    assert cfg.loss_type == "stable_drl" and cfg.mask_seed_mode == "shared"

    make_llada().save_pretrained(tmp_path / "llada")  # by path: TRL loads the reference model from it
    build_tiny_tokenizer().save_pretrained(tmp_path / "llada")

    def run(beta, loss_type):
        args = make_args(tmp_path, loss_type=loss_type, beta=beta, max_steps=2, learning_rate=5e-2)
        trainer = make_trainer(tmp_path, model=str(tmp_path / "llada"), args=args)
        trainer.train()
        logged = [h["kl"] for h in trainer.state.log_history if "kl" in h]
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, logged

    plain, no_kl = run(0.0, loss_type)
    with_kl, kl = run(0.04, loss_type)
    assert no_kl == [] and len(kl) == 2 and kl[0] == pytest.approx(0.0, abs=1e-6) and kl[1] > 0, kl
    assert any(not torch.equal(plain[n], with_kl[n]) for n in plain)


def test_beta_with_an_explicit_fresh_mask_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="KL term.*mask_seed_mode='fresh'.*mask_seed_mode='shared'"):
        config(tmp_path, beta=0.04, mask_seed_mode="fresh")


def test_autoregressive_model_keeps_trls_completion_length(tmp_path, tiny_llama):
    """Left unset, max_completion_length and temperature are 256 and 0.9 for a diffusion LM and TRL's 512 and 1.0
    for an autoregressive model; a value the user sets (even 256 or 0.9) is kept."""
    base = dict(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                per_device_train_batch_size=4, num_generations=4)  # fmt: skip
    unset = StableDRLConfig(**base)
    assert unset.max_completion_length == 256
    kw = dict(reward_funcs=digit_reward, train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())
    ar = StableDRLTrainer(model=tiny_llama, args=unset, **kw)
    assert ar.max_completion_length == 512 and ar.args.max_completion_length == 512
    assert ar.generation_config.max_new_tokens == 512
    assert ar.temperature == ar.args.temperature == ar.generation_config.temperature == 1.0
    assert unset.max_completion_length == 256 and unset.temperature == 0.9  # the caller's config is unchanged
    dlm = StableDRLTrainer(model=make_llada(), args=unset, **kw)
    assert dlm.max_completion_length == 256 and dlm.temperature == 0.9
    by_path = tmp_path / "llama"
    tiny_llama.save_pretrained(by_path)
    assert StableDRLTrainer(model=str(by_path), args=unset, **kw).max_completion_length == 512
    set_args = StableDRLConfig(**base, max_completion_length=256, temperature=0.9)
    explicit = StableDRLTrainer(model=tiny_llama, args=set_args, **kw)
    assert explicit.max_completion_length == 256 and explicit.temperature == 0.9
    # the marker survives a round trip through the config's dict, and serialises as the plain number
    assert json.loads(unset.to_json_string())["max_completion_length"] == 256


def test_resume_from_checkpoint_field_is_read_by_train(tmp_path):
    first = make_trainer(tmp_path, args=make_args(tmp_path, max_steps=1, save_strategy="steps", save_steps=1))
    first.train()
    assert (tmp_path / "out" / "checkpoint-1").is_dir()
    args = make_args(tmp_path, max_steps=2, resume_from_checkpoint="true")
    second = make_trainer(tmp_path, args=args)
    second.train()  # without reading the field this is a fresh run into a folder with checkpoints: refused
    assert second.state.global_step == 2
    assert len([h for h in second.state.log_history if "loss" in h]) == 2  # step 1 restored, step 2 trained


def test_router_aux_loss_is_refused_where_the_loss_drops_it(tmp_path):
    """A mixture-of-experts model's router auxiliary loss is added by TRL's losses only: refused with the
    package's objectives, kept with TRL's."""
    from transformers import MixtralConfig, MixtralForCausalLM

    tok = build_tiny_tokenizer()
    mixtral = MixtralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=2, num_local_experts=2,
                            num_experts_per_tok=1, output_router_logits=True)  # fmt: skip
    kw = dict(reward_funcs=digit_reward, train_dataset=make_dataset(), processing_class=tok)
    with pytest.raises(ValueError, match=r"router_aux_loss_coef=0.001.*loss_type='stable_drl'.*Fix"):
        StableDRLTrainer(model=MixtralForCausalLM(mixtral), args=make_args(tmp_path), **kw)
    trl_loss = StableDRLTrainer(model=MixtralForCausalLM(mixtral), args=make_args(tmp_path, loss_type="dapo"), **kw)
    assert trl_loss.aux_loss_enabled
    no_aux = StableDRLTrainer(model=MixtralForCausalLM(mixtral), args=make_args(tmp_path, router_aux_loss_coef=0.0),
                              **kw)  # fmt: skip
    assert not no_aux.aux_loss_enabled


# --------------------------------------------------------------------------- the output folder's refusal


def test_refusal_of_a_folder_with_checkpoints_gives_fixes_that_work_with_grpo_config_too(tmp_path):
    from test_reliability import fake_checkpoint

    assert "overwrite_output_dir" not in {f.name for f in dataclasses.fields(GRPOConfig)}  # why it is not the fix
    fake_checkpoint(tmp_path / "out" / "checkpoint-5")
    with pytest.raises(ValueError) as info:
        make_trainer(tmp_path).train()
    message = str(info.value)
    for fix in ("resume_from_checkpoint=True", "another output_dir", "delete those checkpoint-* folders"):
        assert fix in message, (fix, message)
    assert "GRPOConfig has no such field" in message
    # following the fixes a GRPOConfig user can follow: another folder, or the old checkpoints deleted
    make_trainer(tmp_path, args=make_args(tmp_path, output_dir=str(tmp_path / "other"), max_steps=1)).train()
    import shutil

    shutil.rmtree(tmp_path / "out" / "checkpoint-5")
    trainer = make_trainer(tmp_path, args=make_args(tmp_path, max_steps=1))
    trainer.train()
    assert trainer.state.global_step == 1


def test_readme_lists_the_changed_grpo_defaults():
    from stabledrl_trl.stabledrl_config import CHANGED_GRPO_DEFAULTS

    readme = (TESTS.parent / "docs" / "usage.md").read_text()  # the drop-in's page, linked from README.md
    for name, (old, new, why) in CHANGED_GRPO_DEFAULTS.items():
        assert f"| `{name}` | `{old!r}` | `{new!r}` | {why} |" in readme, name
