"""StableDRLTrainer end to end on a tiny LLaDA (and a tiny autoregressive Llama) on CPU."""

import inspect

import pytest
import torch
from datasets import Dataset
from tiny_run import digit_reward, make_dataset, make_llada, params_copy, tiny_args
from trl import GRPOTrainer

from stabledrl_trl import StableDRLTrainer
from stabledrl_trl.tiny import build_tiny_tokenizer

# The TRL hooks StableDRLTrainer overrides, with the parameters it relies on (TRL 1.16.0).
EXPECTED_HOOKS = {
    "_generate_single_turn": ["self", "prompt_ids", "images", "multimodal_fields", "num_generations"],
    "_get_per_token_logps_and_entropies": [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ],
    "_generate_and_score_completions": ["self", "inputs"],
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_prepare_inputs": ["self", "generation_batch"],
    "_compute_loss": ["self", "model", "inputs"],
    "training_step": ["self", "model", "inputs", "num_items_in_batch"],
}
# transformers' Trainer hooks StableDRLTrainer overrides for run safety (checkpoints, non-finite guards, DDP, card).
TRAINER_HOOKS = (
    "__init__",
    "_build_accelerator_args",
    "_get_grad_norm",
    "train",
    "_load_from_checkpoint",
    "_issue_warnings_after_load",
    "_load_optimizer_and_scheduler",
    "save_model",
    "_save_checkpoint",
    "create_model_card",
)


def make_args(tmp_path, **kw):
    base = dict(
        gradient_accumulation_steps=1,
        max_completion_length=8,
        block_length=4,
        diffusion_steps=4,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        gradient_checkpointing=False,
        seed=7,
        temperature=1.0,
    )
    return tiny_args(tmp_path, **{**base, **kw})


@pytest.mark.parametrize("name", sorted(EXPECTED_HOOKS))
def test_overridden_hooks_exist_in_trl_with_expected_signature(name):
    assert hasattr(GRPOTrainer, name), f"TRL no longer has {name}: the override would never run"
    params = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
    assert params[: len(EXPECTED_HOOKS[name])] == EXPECTED_HOOKS[name]
    assert name in StableDRLTrainer.__dict__, name
    assert name in StableDRLTrainer.__doc__


def test_every_override_is_listed_documented_and_accepts_the_parents_arguments():
    overrides = {n for n, v in StableDRLTrainer.__dict__.items() if callable(v) and hasattr(GRPOTrainer, n)}
    assert overrides == set(EXPECTED_HOOKS) | set(TRAINER_HOOKS), "a new override: list it here and in the docstring"
    for name in sorted(overrides):
        assert f"`{name}`" in StableDRLTrainer.__doc__, name
        parent = inspect.signature(getattr(GRPOTrainer, name)).parameters
        child = inspect.signature(StableDRLTrainer.__dict__[name]).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in child.values())
        missing = [p for p in parent if p not in child and parent[p].kind is not inspect.Parameter.VAR_KEYWORD]
        assert takes_any or not missing, (name, missing)
        # positional order kept where the override names the parameters
        named = [p for p in child if p in parent]
        assert named == [p for p in parent if p in named], (name, named)


def test_the_trainers_mixins_override_nothing_of_trl():
    """The trainer's helpers live in mixins (diagnostics, run safety, rollout rows); every hook stays in the trainer
    class itself, so the override lists above are complete: a mixin defining a TRL / transformers method would
    override it unlisted."""
    from stabledrl_trl.diagnostics import TrainerDiagnostics
    from stabledrl_trl.rollout_rows import RolloutRows
    from stabledrl_trl.safety_hooks import RunSafety

    mro = StableDRLTrainer.__mro__
    mixins = mro[1 : mro.index(GRPOTrainer)]
    assert set(mixins) == {TrainerDiagnostics, RolloutRows, RunSafety}
    for mixin in mixins:
        shadowed = [n for n in vars(mixin) if not n.startswith("__") and hasattr(GRPOTrainer, n)]
        assert shadowed == [], (mixin.__name__, shadowed)


def test_training_steps_run_every_override_and_change_the_model(tmp_path):
    tok = build_tiny_tokenizer()
    model = make_llada()
    trainer = StableDRLTrainer(
        model=model,
        reward_funcs=digit_reward,
        args=make_args(tmp_path),
        train_dataset=make_dataset(),
        processing_class=tok,
    )
    assert trainer.is_diffusion
    calls = {name: 0 for name in EXPECTED_HOOKS}
    for name in EXPECTED_HOOKS:
        original = getattr(trainer, name)

        def counted(*a, _name=name, _orig=original, **k):
            calls[_name] += 1
            return _orig(*a, **k)

        setattr(trainer, name, counted)
    before = params_copy(trainer.model)
    trainer.train()
    assert all(n > 0 for n in calls.values()), calls
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before), "every parameter receives a gradient under stable_drl"
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3
    for key in (
        "stabledrl/weight_mean",
        "stabledrl/weight_max",
        "stabledrl/clip_frac",
        "stabledrl/ess",
        "stabledrl/log_ratio_std",
        "stabledrl/skipped",
        "stabledrl/estimator_noise_std",
        "stabledrl/weight_mean_neg_adv",
        "stabledrl/weight_mean_pos_adv",
        "stabledrl/equal_reward_group_frac",
        "reward",
        "grad_norm",
    ):
        for h in logs:
            assert key in h and torch.isfinite(torch.tensor(float(h[key]))), (key, h)
    for h in logs:
        assert 1.0 <= h["stabledrl/ess"] <= 4.0
        assert h["stabledrl/estimator_noise_std"] > 0 and 0.0 <= h["stabledrl/equal_reward_group_frac"] <= 1.0
        # fresh masks: the old policy is scored on its own masks, so weights differ from 1 even at step one
        assert h["stabledrl/log_ratio_std"] > 0


@pytest.fixture
def register_objective():
    """`objectives.register_objective`, with every name this test registers removed again afterwards."""
    from stabledrl_trl import objectives

    names = []

    def register(name, **declared):
        def wrap(fn):
            objectives.register_objective(name, **declared)(fn)
            names.append(name)
            return fn

        return wrap

    yield register
    for name in names:
        objectives.OBJECTIVES.pop(name)


def test_a_new_objective_is_one_registration(tmp_path, register_objective):
    """A new loss_type registered here (and nowhere else): the config accepts it, refuses GRPOConfig fields it does
    not declare, the trainer calls it with the batch and its declared settings, normalises its group loss, logs its
    statistics and trains the model, and the model card names it."""
    from stabledrl_trl import objectives

    with pytest.raises(ValueError, match="loss_type='toy_group' is not known"):
        make_args(tmp_path, loss_type="toy_group")
    seen = []

    @register_objective("toy_group", level="group", settings=("clip_c",), statistics=("applied_weight",))
    def toy(x: objectives.PolicyLossInputs) -> objectives.ObjectiveOutput:
        seen.append(x)
        seq = x.sequence_mean(x.per_token_logps)  # (B,)
        groups = x.advantages.shape[0] // x.group_size
        # value 3.0 per group, gradient of -sum_i A_i L_i: the policy moves
        unit = (-(x.advantages * (seq - seq.detach()))).view(groups, -1).sum(-1) + 3.0  # (G_n,)
        ones = torch.ones_like(x.advantages)
        return objectives.ObjectiveOutput(unit, "group", {"toy_stat": torch.tensor(0.25), "applied_weight": ones})

    with pytest.raises(ValueError, match="epsilon=0.3 cannot apply with loss_type='toy_group'"):
        make_args(tmp_path, loss_type="toy_group", epsilon=0.3)
    args = make_args(tmp_path, loss_type="toy_group", max_steps=2, clip_c=3.5, per_device_train_batch_size=8)
    assert args.mask_seed_mode == "shared"  # what a registration leaves unset: the safe automatic mode
    model = make_llada()
    before = params_copy(model)
    trainer = StableDRLTrainer(
        model=model,
        reward_funcs=digit_reward,
        args=args,
        train_dataset=make_dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    trainer.train()
    assert len(seen) == 2
    for x in seen:
        assert x.group_size == 4 and dict(x.settings) == {"clip_c": 3.5} and x.per_token_logps.shape == x.mask.shape
        assert x.per_token_logps.requires_grad and not x.old_per_token_logps.requires_grad
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for h in logs:
        # two groups of 3.0 per micro-batch, divided by the two groups of the optimiser step
        assert h["loss"] == pytest.approx(3.0)
        assert h["stabledrl/toy_stat"] == pytest.approx(0.25)
    # the toy's applied weights (all 1) reach the per-sign means
    weights = [
        h[k] for h in logs for k in ("stabledrl/weight_mean_neg_adv", "stabledrl/weight_mean_pos_adv") if k in h
    ]
    assert weights and all(w == 1.0 for w in weights)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    from stabledrl_trl.model_card import describe_objective

    assert "`toy_group`" in describe_objective(args)[1]


def test_a_new_token_objective_without_optional_statistics_trains(tmp_path, register_objective):
    """A token-level objective that returns no applied weights: nothing is looked up that it did not declare; a
    statistic it declares but does not return is named in the error."""
    from stabledrl_trl import objectives

    @register_objective("toy_token", level="token")
    def toy(x):
        return objectives.ObjectiveOutput(-(x.per_token_logps - x.per_token_logps.detach()) * x.advantages[:, None], "token")

    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=digit_reward,
        args=make_args(tmp_path, loss_type="toy_token", max_steps=1),
        train_dataset=make_dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert log["loss"] == pytest.approx(0.0, abs=1e-6) and "stabledrl/weight_mean_pos_adv" not in log

    @register_objective("toy_token_stats", level="token", statistics=("applied_weight",))
    def toy_stats(x):
        return toy(x)

    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=digit_reward,
        args=make_args(tmp_path, loss_type="toy_token_stats", max_steps=1),
        train_dataset=make_dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    with pytest.raises(KeyError, match=r"'toy_token_stats' declares the statistics \['applied_weight'\]"):
        trainer.train()


def test_a_new_estimator_is_one_registration(tmp_path):
    """A likelihood estimator registered here (and nowhere else): the config accepts its name, the family passes it
    its declared option from the config and its default sample count, and a step trains with it."""
    from stabledrl_trl.diffusion import estimators

    with pytest.raises(ValueError, match="likelihood_estimator='toy_blocks' is not known"):
        make_args(tmp_path, likelihood_estimator="toy_blocks")
    calls = []

    @estimators.register_estimator("toy_blocks", default_samples=3, options={"block_size": "estimator_block_size"})
    @estimators.shared_keywords(num_samples=None, p_mask_prompt=0.0)
    def toy_blocks(x: estimators.EstimatorInputs, *, block_size=32):  # only its own option; the rest is in x
        calls.append((x.num_samples, block_size, x.p_mask_prompt))
        return estimators.block_random.on_inputs(x, block_size=block_size)

    try:
        with pytest.raises(ValueError, match="sandwich=True needs likelihood_estimator="):
            make_args(tmp_path, likelihood_estimator="toy_blocks", sandwich=True)
        args = make_args(tmp_path, likelihood_estimator="toy_blocks", estimator_block_size=2, max_steps=1)
        assert args.num_mc_samples == 3
        model = make_llada()
        before = params_copy(model)
        trainer = StableDRLTrainer(
            model=model,
            reward_funcs=digit_reward,
            args=args,
            train_dataset=make_dataset(),
            processing_class=build_tiny_tokenizer(),
        )
        trainer.train()
    finally:
        estimators.ESTIMATOR_SPECS.pop("toy_blocks")
    assert calls and set(calls) == {(3, 2, 0.0)}  # its default samples, the config's block size, its own p_mask
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert log["stabledrl/estimator_passes"] == 3.0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_lora_trains_adapters_only(tmp_path):
    from peft import LoraConfig

    tok = build_tiny_tokenizer()
    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=digit_reward,
        args=make_args(tmp_path),
        train_dataset=make_dataset(),
        processing_class=tok,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    before = params_copy(trainer.model)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    lora = [n for n in before if "lora_" in n]
    base = [n for n in before if "lora_" not in n]
    assert lora and base
    assert all(torch.equal(after[n], before[n]) for n in base), "base weights must stay frozen"
    assert any(not torch.equal(after[n], before[n]) for n in lora if "lora_B" in n)


def test_d1_recipe_grpo_mean_field_shared_masks_with_reference(tmp_path):
    """diffu-GRPO (d1): TRL's grpo + mean-field estimator + shared mask seeds + beta 0.04, num_iterations 2."""
    from peft import LoraConfig

    tok = build_tiny_tokenizer()
    args = make_args(
        tmp_path,
        loss_type="grpo",
        likelihood_estimator="mean_field",
        mask_seed_mode="shared",
        beta=0.04,
        num_iterations=2,
        max_steps=2,
    )
    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=digit_reward,
        args=args,
        train_dataset=make_dataset(),
        processing_class=tok,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    # iteration 0 is on-policy with the same masks: the KL to the (adapter-free) reference starts at 0
    assert logs[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)


@pytest.mark.parametrize("loss_type", ["stable_drl_ratio", "dgpo", "dapo"])
def test_other_objectives_train(tmp_path, loss_type):
    tok = build_tiny_tokenizer()
    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=digit_reward,
        args=make_args(tmp_path, loss_type=loss_type, max_steps=2),
        train_dataset=make_dataset(),
        processing_class=tok,
    )
    before = params_copy(trainer.model)
    trainer.train()
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_autoregressive_model_keeps_trl_generation_and_exact_logps(tmp_path, tiny_llama):
    tok = build_tiny_tokenizer()
    trainer = StableDRLTrainer(
        model=tiny_llama,
        reward_funcs=digit_reward,
        args=make_args(tmp_path, max_steps=2),
        train_dataset=make_dataset(),
        processing_class=tok,
    )
    assert not trainer.is_diffusion
    # exact log-probs: TRL's causal path, equal to log_softmax of the shifted logits
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    am = torch.ones_like(ids)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, 3)
    logits = trainer.model(input_ids=ids).logits
    ref = torch.log_softmax(logits[:, -4:-1].float(), -1).gather(-1, ids[:, -3:, None])[..., 0]
    torch.testing.assert_close(logps, ref, atol=1e-5, rtol=1e-5)
    before = params_copy(trainer.model)
    trainer.train()
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_grpo_gradient_grows_with_planted_ratio_but_stable_drl_does_not(tmp_path):
    """The same planted outlier (ratio r on a negative-advantage sample) through the trainer's real loss code."""
    tok = build_tiny_tokenizer()
    g = 4
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    completion_ids = torch.tensor([[10, 11, 12, 0]] * g)
    completion_mask = torch.tensor([[1, 1, 1, 1]] * g)
    prompt_ids = torch.tensor([[3, 20, 21, 2, 4]] * g)
    prompt_mask = torch.ones_like(prompt_ids)

    def grad_norm(loss_type, ratio):
        args = make_args(tmp_path, loss_type=loss_type, likelihood_estimator="mean_field", mask_seed_mode="shared")
        trainer = StableDRLTrainer(
            model=make_llada(),
            reward_funcs=digit_reward,
            args=args,
            train_dataset=make_dataset(),
            processing_class=tok,
        )
        model = trainer.model
        trainer.current_gradient_accumulation_steps = 1  # set by the training loop; this test calls the loss directly
        ids = torch.cat([prompt_ids, completion_ids], 1)
        am = torch.cat([prompt_mask, completion_mask], 1)
        trainer._scoring.mask_stream = (2, 0, 0)
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, am, completion_ids.size(1))
        old = logps.clone()
        # plant: sample 1 (A < 0) gets log ratio log(ratio) on its first token (TRL's grpo is token level);
        # its sequence-level log weight (token mean) log(ratio)/4 is above log C = log 5 for every ratio below
        old[1, 0] -= torch.log(torch.tensor(ratio))
        inputs = dict(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            advantages=adv,
            old_per_token_logps=old,
            num_items_in_batch=completion_mask.sum(),
            mask_gen_step=torch.zeros(g, dtype=torch.long),
        )
        model.zero_grad()
        trainer._compute_loss(model, inputs).backward()
        return torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None)).item()

    grpo = [grad_norm("grpo", r) for r in (1e3, 1e5, 1e7)]
    assert grpo[1] > 50 * grpo[0] and grpo[2] > 50 * grpo[1], grpo
    stable = [grad_norm("stable_drl", r) for r in (1e3, 1e5, 1e7)]
    assert stable[0] == pytest.approx(stable[1], rel=1e-5) and stable[1] == pytest.approx(stable[2], rel=1e-5)


def test_nonfinite_reward_is_dropped_and_counted(tmp_path):
    tok = build_tiny_tokenizer()

    def sometimes_inf(prompts, completions, **kw):
        out = digit_reward(prompts, completions)
        out[0] = float("inf")
        return out

    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=sometimes_inf,
        args=make_args(tmp_path, max_steps=2),
        train_dataset=make_dataset(),
        processing_class=tok,
    )
    before = params_copy(trainer.model)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for h in logs:
        assert h["stabledrl/nonfinite_rewards"] == 1.0
        assert h["stabledrl/skipped"] >= 1.0
    for n, p in trainer.model.named_parameters():
        assert torch.isfinite(p).all()
        assert not torch.equal(p, before[n])


def test_reward_function_that_raises_names_function_and_sample(tmp_path):
    from stabledrl_trl.stabledrl_trainer import RewardFunctionError

    tok = build_tiny_tokenizer()

    def fragile_reward(prompts, completions, **kw):
        # fails on one completion only: the error must point at it
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        if len(completions) == 1 and calls.append(1) is None and len(calls) == 3:
            raise ZeroDivisionError("boom")
        if len(completions) > 1:
            raise ZeroDivisionError("boom")
        return [float(len(t)) for t in texts]

    calls = []

    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=fragile_reward,
        args=make_args(tmp_path, max_steps=2),
        train_dataset=make_dataset(),
        processing_class=tok,
    )
    with pytest.raises(RewardFunctionError) as info:
        trainer.train()
    message = str(info.value)
    assert "fragile_reward" in message and "ZeroDivisionError" in message and "sample 2" in message
    assert "+" in message  # the sample's prompt is shown


@pytest.mark.parametrize("where", ["current", "old"])
def test_nonfinite_likelihood_estimate_is_dropped_and_training_continues(tmp_path, monkeypatch, where):
    import stabledrl_trl.diffusion.families.full_attention as mod  # the full-attention families call it

    real = mod.estimate_likelihood

    def planted(*args, **kwargs):
        est = real(*args, **kwargs)
        # plant NaN in row 0 of the gradient-carrying (current) or the no-grad (old) estimate
        if torch.is_grad_enabled() == (where == "current"):
            token = est.token_logps.clone()
            token[0] = float("nan")
            est.token_logps = token
        return est

    monkeypatch.setattr(mod, "estimate_likelihood", planted)
    tok = build_tiny_tokenizer()
    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=digit_reward,
        args=make_args(tmp_path, max_steps=2),
        train_dataset=make_dataset(),
        processing_class=tok,
    )
    before = params_copy(trainer.model)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for h in logs:
        assert h["stabledrl/skipped"] >= 1.0
        assert torch.isfinite(torch.tensor(h["loss"]))
    for n, p in trainer.model.named_parameters():
        assert torch.isfinite(p).all(), n
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_safe_defaults(tmp_path):
    args = make_args(tmp_path)
    assert args.trust_remote_code is False


def test_model_given_as_a_path_loads_through_trl(tmp_path, llada_fixture_dir):
    """TRL's create_model_from_path on a LLaDA checkpoint whose config carries a remote-code auto_map."""
    tok = build_tiny_tokenizer()
    path = tmp_path / "tiny-llada"
    make_llada().save_pretrained(path)
    args = make_args(tmp_path, max_steps=1)
    args.model_init_kwargs = {"use_safetensors": True}
    trainer = StableDRLTrainer(
        model=str(path), reward_funcs=digit_reward, args=args, train_dataset=make_dataset(), processing_class=tok
    )
    assert type(trainer.model).__name__ == "LLaDAModelLM" and trainer.is_diffusion
    trainer.train()
    # the hub layout (LLaDA names, auto_map to remote code) loads too, without running remote code
    # (the tiny character tokenizer is not the fixture's: give the fixture's mask id explicitly)
    fixture = StableDRLTrainer(
        model=str(llada_fixture_dir),
        reward_funcs=digit_reward,
        args=make_args(tmp_path, mask_token_id=317),
        train_dataset=make_dataset(),
        processing_class=tok,
    )
    assert type(fixture.model).__name__ == "LLaDAModelLM"


def test_plain_grpo_config_is_refused_with_the_fix(tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        num_generations=2,
        per_device_train_batch_size=2,
    )
    with pytest.raises(TypeError, match="StableDRLConfig"):
        StableDRLTrainer(
            model=make_llada(),
            reward_funcs=digit_reward,
            args=args,
            train_dataset=make_dataset(),
            processing_class=build_tiny_tokenizer(),
        )


def test_reward_error_mid_run_leaves_last_checkpoint_intact(tmp_path):
    import json

    from transformers import AutoModelForCausalLM

    from stabledrl_trl.stabledrl_trainer import RewardFunctionError

    batches = []

    def failing_on_third_batch(prompts, completions, **kw):
        if len(completions) > 1:
            batches.append(1)
        if len(batches) >= 3:
            raise RuntimeError("scorer crashed")
        return digit_reward(prompts, completions)

    args = make_args(tmp_path, max_steps=5, save_strategy="steps", save_steps=1)
    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=failing_on_third_batch,
        args=args,
        train_dataset=make_dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    with pytest.raises(RewardFunctionError, match="failing_on_third_batch"):
        trainer.train()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-1",
        "checkpoint-2",
    ]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    reloaded = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2")
    for (name, p), q in zip(trainer.model.named_parameters(), reloaded.parameters(), strict=True):
        assert torch.equal(p.detach(), q.detach()), name  # the failed step changed nothing after checkpoint-2


@pytest.mark.parametrize("reward_text", ["completion", "canvas"])
def test_rollout_mode_is_used_and_rollout_cost_is_logged(tmp_path, monkeypatch, reward_text):
    from stabledrl_trl.diffusion import family_base as family_module  # where the samplers are called

    seen = []
    original = family_module.llada_generate

    def spy(*args, **kwargs):
        seen.append({k: kwargs[k] for k in ("cache", "threshold", "max_tokens_per_step", "early_stop")})
        return original(*args, **kwargs)

    monkeypatch.setattr(family_module, "llada_generate", spy)
    args = make_args(
        tmp_path,
        max_steps=1,
        rollout_cache="dual",
        parallel_threshold=0.9,
        max_tokens_per_step=2,
        block_length=4,
        reward_text=reward_text,
    )
    trainer = StableDRLTrainer(
        model=make_llada(), reward_funcs=digit_reward, args=args, train_dataset=make_dataset(),
        processing_class=build_tiny_tokenizer(),
    )  # fmt: skip
    trainer.train()
    # a graded canvas needs the tokens after the first EOS: finished rows then keep decoding
    expected = {"cache": "dual", "threshold": 0.9, "max_tokens_per_step": 2, "early_stop": reward_text != "canvas"}
    assert seen and all(s == expected for s in seen)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for h in logs:
        assert h["stabledrl/rollout_seconds"] > 0 and h["stabledrl/rollout_tokens_per_s"] > 0
        # 2 blocks of 4 steps' budget: between 2 (threshold reveals whole blocks) and 4 forwards per completion
        assert 2 <= h["stabledrl/rollout_forward_passes"] <= 4


def test_rollout_cache_refused_for_a_model_without_the_cache_path(tmp_path):
    from stabledrl_trl.models.dream import DreamConfig, DreamModel

    tok = build_tiny_tokenizer()
    dream = DreamModel(
        DreamConfig(
            vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, mask_token_id=1, eos_token_id=0, pad_token_id=0,
        )
    )  # fmt: skip
    with pytest.raises(ValueError, match="rollout_cache='prefix' needs LLaDA"):
        StableDRLTrainer(
            model=dream, reward_funcs=digit_reward,
            args=make_args(tmp_path, rollout_cache="prefix", diffusion_sampler="llada"),
            train_dataset=make_dataset(), processing_class=tok,
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------- ratio pairings


@pytest.mark.parametrize("estimator", ["mean_field", "mc_elbo", "mc_elbo_inv_t", "block_random", "coupled"])
def test_trl_sequence_level_grpo_uses_exactly_the_estimators_sequence_log_weight(tmp_path, estimator):
    """The paper's GRPO baseline: TRL's importance_sampling_level='sequence' averages the per-token log-ratios over
    the completion mask, which for these estimators is exactly L_theta - L_old, with fresh (independent) masks."""
    tok = build_tiny_tokenizer()
    args = make_args(
        tmp_path,
        loss_type="grpo",
        importance_sampling_level="sequence",
        likelihood_estimator=estimator,
        mask_seed_mode="fresh",
        epsilon=0.01,
    )
    trainer = StableDRLTrainer(
        model=make_llada(), reward_funcs=digit_reward, args=args, train_dataset=make_dataset(), processing_class=tok
    )
    model, g = trainer.model, 4
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; this test calls the loss directly
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    completion_ids = torch.tensor([[10, 11, 12, 0, 0], [13, 0, 0, 0, 0], [14, 15, 16, 17, 0], [18, 19, 0, 0, 0]])
    completion_mask = (torch.arange(5)[None] <= torch.tensor([3, 1, 4, 2])[:, None]).long()
    prompt_ids = torch.tensor([[3, 20, 21, 2, 4]] * g)
    prompt_mask = torch.ones_like(prompt_ids)
    ids, am = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    trainer._scoring.mask_stream = (1, 0)  # the old policy's own masks
    with torch.no_grad():
        old, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, am, completion_ids.size(1))
    old_seq = trainer._scoring.last_estimate.seq_logps.clone()
    inputs = dict(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        advantages=adv,
        old_per_token_logps=old,
        num_items_in_batch=completion_mask.sum(),
        mask_gen_step=torch.zeros(g, dtype=torch.long),
    )
    loss = trainer._compute_loss(model, inputs)
    seq = trainer._scoring.last_estimate.seq_logps.detach()
    assert not torch.allclose(seq, old_seq)  # independent masks: the weight is not 1
    # by hand: rho = exp(L_theta - L_old), GRPO's conditional clip, mean over the G sequences (1/G)
    rho = torch.exp(seq - old_seq)
    expected = -torch.minimum(rho * adv, rho.clamp(1 - 0.01, 1 + 0.01) * adv).mean()
    torch.testing.assert_close(loss.detach(), expected, atol=1e-6, rtol=1e-5)
    region = ((rho < 0.99) & (adv < 0)) | ((rho > 1.01) & (adv > 0))
    assert trainer._metrics["train"]["clip_ratio/region_mean"][-1] == pytest.approx(region.float().mean().item())
    # the largest unclipped ratio is logged for TRL's losses too, at the level the loss consumes
    assert trainer._metrics["train"]["stabledrl/weight_max"][-1] == pytest.approx(rho.max().item(), rel=1e-5)


def test_fresh_per_token_ratios_are_mask_noise_and_shared_masks_are_not(tmp_path):
    """Why the config refuses per-token ratios on independent random masks: measured log-ratios at theta = theta_old."""
    tok = build_tiny_tokenizer()
    ids = torch.tensor([[3, 20, 21, 2, 4, 10, 11, 12, 13, 14, 15, 16, 0]] * 4)
    am = torch.ones_like(ids)
    spread = {}
    for mode in ("fresh", "shared"):
        args = make_args(tmp_path, loss_type="dgpo", mask_seed_mode=mode, allow_noisy_token_ratios=True)
        trainer = StableDRLTrainer(
            model=make_llada(),
            reward_funcs=digit_reward,
            args=args,
            train_dataset=make_dataset(),
            processing_class=tok,
        )
        with torch.no_grad():
            trainer._scoring.mask_stream = (2, 0, 0) if mode == "shared" else (1, 0)
            old, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, 8)
            old_seq = trainer._scoring.last_estimate.seq_logps
            trainer._scoring.mask_stream = (2, 0, 0) if mode == "shared" else (3, 0, 0)
            cur, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, 8)
            cur_seq = trainer._scoring.last_estimate.seq_logps
        spread[mode] = ((cur - old).abs().max().item(), (cur_seq - old_seq).abs().max().item())
    assert spread["shared"] == (0.0, 0.0)  # the same masks, the same policy: every ratio is exactly 1
    token_fresh, seq_fresh = spread["fresh"]
    assert token_fresh > 2.0  # a token masked in one pass and not the other: |log-ratio| ~ its log-prob (~ log 101)
    assert seq_fresh < token_fresh / 4  # the sequence log-weight averages that noise


def _clipping_trainer(tmp_path, **kw):
    tok = build_tiny_tokenizer()
    args = make_args(tmp_path, max_steps=3, all_clipped_patience=2, **kw)
    return StableDRLTrainer(
        model=make_llada(), reward_funcs=digit_reward, args=args, train_dataset=make_dataset(), processing_class=tok
    )


def test_every_sample_clipped_for_consecutive_steps_warns_and_is_logged(tmp_path, caplog):
    # fresh masks make every sequence ratio differ from 1 by mask noise; a band of +-0.1% clips all of them
    trainer = _clipping_trainer(
        tmp_path, loss_type="stable_drl_ratio", mask_seed_mode="fresh", epsilon=1e-3, p_mask_prompt=0.5
    )
    with caplog.at_level("WARNING", logger="stabledrl_trl.stabledrl_trainer"):
        trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["stabledrl/clip_frac"] for h in logs] == [1.0, 1.0, 1.0]
    assert [h["stabledrl/all_clipped"] for h in logs] == [1.0, 1.0, 1.0]
    assert [h["stabledrl/all_clipped_streak"] for h in logs] == [1.0, 2.0, 3.0]
    assert all(h["grad_norm"] == 0.0 for h in logs)  # no learning
    warned = [r.getMessage() for r in caplog.records if "consecutive optimiser steps" in r.getMessage()]
    assert len(warned) == 1 and "2 consecutive" in warned[0] and "mask_seed_mode='shared'" in warned[0]


def test_no_all_clipped_warning_when_ratios_are_meaningful(tmp_path, caplog):
    trainer = _clipping_trainer(tmp_path, loss_type="stable_drl_ratio")  # auto: shared masks, ratio exactly 1
    with caplog.at_level("WARNING", logger="stabledrl_trl.stabledrl_trainer"):
        trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["stabledrl/all_clipped"] for h in logs] == [0.0, 0.0, 0.0]
    assert all(h["grad_norm"] > 0 for h in logs)
    assert not [r for r in caplog.records if "consecutive optimiser steps" in r.getMessage()]


@pytest.mark.slow
def test_every_loss_type_trains_under_its_defaults_with_bounded_gradients(tmp_path):
    """Under its defaults (mask_seed_mode auto), every loss type trains a tiny LLaDA for 6 steps with
    num_iterations 2: finite gradient norms no larger than 100x stable_drl's, and the parameters change."""
    from stabledrl_trl.stabledrl_config import OWN_LOSS_TYPES, TRL_LOSS_TYPES

    tok = build_tiny_tokenizer()
    max_norms, modes = {}, {}
    for loss_type in ("stable_drl", *[t for t in OWN_LOSS_TYPES + TRL_LOSS_TYPES if t != "stable_drl"]):
        args = make_args(
            tmp_path / loss_type,
            loss_type=loss_type,
            max_completion_length=16,
            block_length=8,
            diffusion_steps=8,
            num_iterations=2,
            max_steps=6,
            learning_rate=1e-3,
        )
        modes[loss_type] = args.mask_seed_mode
        trainer = StableDRLTrainer(
            model=make_llada(),
            reward_funcs=digit_reward,
            args=args,
            train_dataset=make_dataset(),
            processing_class=tok,
        )
        before = params_copy(trainer.model)
        trainer.train()
        norms = torch.tensor([h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h])
        assert norms.numel() == 6 and bool(torch.isfinite(norms).all()), (loss_type, norms)
        max_norms[loss_type] = norms.max().item()
        assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters()), loss_type
    assert modes["stable_drl"] == "fresh" and all(m == "shared" for t, m in modes.items() if t != "stable_drl")
    bound = 100 * max_norms["stable_drl"]
    print("max grad norm per loss type:", {k: round(v, 4) for k, v in max_norms.items()})
    assert all(v <= bound for v in max_norms.values()), max_norms


def make_dream(seed=0):
    """A tiny Dream (Qwen2, bidirectional, shifted logits) on the tiny tokenizer's ids: mask 1, EOS / pad 0."""
    from stabledrl_trl.models.dream import DreamConfig, DreamModel

    config = DreamConfig(
        vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, mask_token_id=1, eos_token_id=0, pad_token_id=0, bos_token_id=0, rope_theta=1e6,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return DreamModel(config)


def test_dream_trains_with_dreams_own_sampler(tmp_path, monkeypatch):
    from stabledrl_trl.diffusion import family as family_module

    seen = []
    dream_sampler = family_module.SAMPLERS["dream"]

    def spy(adapter, prompt_ids, prompt_mask, args, eos_token_ids, generator):
        out = dream_sampler.run(adapter, prompt_ids, prompt_mask, args, eos_token_ids, generator)
        seen.append((args.dream_alg, out.completion_ids.shape))
        return out

    monkeypatch.setitem(family_module.SAMPLERS, "dream", dream_sampler._replace(run=spy))
    monkeypatch.setitem(family_module.SAMPLERS, "llada", None)  # would raise if LLaDA's sampler were picked
    model = make_dream()
    trainer = StableDRLTrainer(
        model=model,
        reward_funcs=digit_reward,
        args=make_args(tmp_path, max_steps=2, top_p=0.95, block_length=None),  # Dream's sampler has no blocks
        train_dataset=make_dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    assert trainer.is_diffusion and trainer._family_name == "dream"
    before = params_copy(trainer.model)
    trainer.train()
    assert seen and all(alg == "entropy" and shape == (4, 8) for alg, shape in seen)  # Dream's README default
    assert all(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_sampler_setting_the_family_ignores_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match="dream_alg"):
        StableDRLTrainer(
            model=make_llada(),
            reward_funcs=digit_reward,
            args=make_args(tmp_path, dream_alg="origin"),
            train_dataset=make_dataset(),
            processing_class=build_tiny_tokenizer(),
        )


def test_llada_rollouts_draw_from_the_configured_top_k(tmp_path, monkeypatch):
    """GRPOConfig's top_k / top_p reach LLaDA's sampler: with top_k=1 every draw is the argmax, so at temperature
    0.9 every completion of a prompt equals the greedy one."""
    from stabledrl_trl.diffusion import family_base as family_module  # where the samplers are called

    seen = []
    llada_generate = family_module.llada_generate

    def spy(*a, **kw):
        out = llada_generate(*a, **kw)
        greedy = llada_generate(*a, **{**kw, "temperature": 0.0, "top_k": None, "top_p": None})
        seen.append((kw["top_k"], kw["top_p"], torch.equal(out.completion_ids, greedy.completion_ids)))
        return out

    monkeypatch.setattr(family_module, "llada_generate", spy)
    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=digit_reward,
        args=make_args(tmp_path, max_steps=1, top_k=1, temperature=0.9),
        train_dataset=make_dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    trainer.train()
    assert seen and all(s == (1, 1.0, True) for s in seen)  # passed as configured: top_p 1.0 = off


@pytest.mark.parametrize("completion_end, expected", [("any_eos", [10, 11, 2]), ("tokenizer_eos", [10, 11, 2, 12, 0])])
def test_completion_end_decides_which_eos_ends_the_scored_completion(tmp_path, monkeypatch, completion_end, expected):
    """Official: only tokenizer.eos_token_id (<|endoftext|>, 0 here) ends it; <|eot_id|> (2) before it is scored."""
    from stabledrl_trl.diffusion.llada_sampler import SamplerOutput, completion_mask_from_ids

    tok = build_tiny_tokenizer()
    args = make_args(tmp_path, completion_end=completion_end)
    trainer = StableDRLTrainer(
        model=make_llada(), reward_funcs=digit_reward, args=args, train_dataset=make_dataset(), processing_class=tok
    )
    seen = {}

    def fake_generate(adapter, prompt_ids, prompt_mask, args, *, eos_token_ids, generator):
        seen["eos"] = tuple(eos_token_ids)
        ids = torch.tensor([[10, 11, 2, 12, 0, 0, 13, 0]]).expand(prompt_ids.shape[0], -1)  # (B, 8)
        return SamplerOutput(ids, completion_mask_from_ids(ids, eos_token_ids))

    monkeypatch.setattr(trainer._diffusion_family, "generate", fake_generate)
    completions, _ = trainer._generate_single_turn([[3, 20, 4]], None, None, 1)
    assert completions == [expected]
    assert (seen["eos"] == (0,)) == (completion_end == "tokenizer_eos")


# ---- reward_text: the completion up to the first EOS (TRL) or the whole rollout canvas (official StableDRL)


def _canvas_rollouts(tok, calls):
    """A family `generate` stand-in: row k of the run gets the canvas  "<k%10>" EOS "a<k>"  then EOS padding."""
    from stabledrl_trl.diffusion.llada_sampler import SamplerOutput

    def encode(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    def generate(adapter, prompt_ids, prompt_mask, args, *, eos_token_ids, generator):
        rows, masks = [], []
        for _ in range(prompt_ids.size(0)):
            k = len(calls)
            head, tail = encode(str(k % 10)) + [tok.eos_token_id], encode(f"a{k}")
            canvas = head + tail
            canvas += [tok.eos_token_id] * (args.max_completion_length - len(canvas))
            rows.append(canvas)
            masks.append([1] * len(head) + [0] * (len(canvas) - len(head)))
            calls.append((f"{k % 10}", f"{k % 10}a{k}", head))
        return SamplerOutput(torch.tensor(rows), torch.tensor(masks))

    return generate


@pytest.mark.parametrize("conversational", [True, False])
@pytest.mark.parametrize("reward_text", ["completion", "canvas"])
def test_reward_text_grades_the_cut_completion_or_the_whole_canvas(tmp_path, monkeypatch, reward_text, conversational):
    tok = build_tiny_tokenizer()
    seen = []

    def recording_reward(prompts, completions, completion_ids, **kw):
        seen.append((list(completions), [list(ids) for ids in completion_ids]))
        return [float(i) for i in range(len(completions))]  # varied: non-zero advantages

    dataset = make_dataset()
    if not conversational:
        dataset = Dataset.from_list([{"prompt": f"{i}+{i + 1}="} for i in range(8)])
    trainer = StableDRLTrainer(
        model=make_llada(),
        reward_funcs=recording_reward,
        args=make_args(tmp_path, max_steps=2, reward_text=reward_text),
        train_dataset=dataset,
        processing_class=tok,
    )
    calls = []
    monkeypatch.setattr(trainer._diffusion_family, "generate", _canvas_rollouts(tok, calls))
    trainer.train()

    assert len(seen) == 2 and len(calls) == 8  # two generation batches of 4 rows
    texts = [c for batch, _ in seen for c in batch]
    expected_text = [canvas if reward_text == "canvas" else cut for cut, canvas, _ in calls]
    if conversational:
        assert texts == [[{"role": "assistant", "content": t}] for t in expected_text]
    else:
        assert texts == expected_text
    # the trained tokens (and the completion_ids the reward sees) end at the EOS either way
    assert [ids for _, batch in seen for ids in batch] == [head for _, _, head in calls]


def test_reward_text_canvas_is_refused_for_autoregressive_models(tmp_path, tiny_llama):
    tok = build_tiny_tokenizer()
    with pytest.raises(ValueError, match="reward_text='canvas'.*autoregressively.*reward_text='completion'"):
        StableDRLTrainer(
            model=tiny_llama,
            reward_funcs=digit_reward,
            args=make_args(tmp_path, reward_text="canvas"),
            train_dataset=make_dataset(),
            processing_class=tok,
        )


def test_saved_models_are_in_lladas_format_and_checkpoints_resume_exactly(tmp_path, llada_fixture_dir):
    """Checkpoints and the final model carry LLaDA's weight names, config keys and auto_map (LLaDA's own code loads
    them); resuming from such a checkpoint reproduces the uninterrupted run's weights exactly."""
    import json

    from safetensors.torch import load_file

    def id_reward(prompts, completions, completion_ids=None, **kwargs):
        # The fixture's ids mostly fall outside the tiny tokenizer, so grade the ids: rewards vary, the model moves.
        return [float(sum(ids) % 5) for ids in completion_ids]

    def trainer_for(out, **kw):
        args = make_args(tmp_path, output_dir=str(out), mask_token_id=317, max_steps=2, **kw)
        return StableDRLTrainer(
            model=str(llada_fixture_dir),
            reward_funcs=id_reward,
            args=args,
            train_dataset=make_dataset(),
            processing_class=build_tiny_tokenizer(),
        )

    full = trainer_for(tmp_path / "full", save_strategy="steps", save_steps=1)
    full.train()
    full.save_model(str(tmp_path / "final"))
    fixture_names = sorted(load_file(str(llada_fixture_dir / "model.safetensors")))
    fixture_config = json.loads((llada_fixture_dir / "config.json").read_text())
    for folder in (tmp_path / "full" / "checkpoint-1", tmp_path / "final"):
        assert sorted(load_file(str(folder / "model.safetensors"))) == fixture_names
        saved = json.loads((folder / "config.json").read_text())
        for key in ("auto_map", "model_type", "rope_theta", "d_model", "n_layers", "embedding_size", "weight_tying"):
            assert saved[key] == fixture_config[key], key
    final = load_file(str(tmp_path / "final" / "model.safetensors"))
    initial = load_file(str(llada_fixture_dir / "model.safetensors"))
    assert not torch.equal(
        final["model.transformer.blocks.0.ff_proj.weight"], initial["model.transformer.blocks.0.ff_proj.weight"]
    )

    resumed = trainer_for(tmp_path / "resumed", save_strategy="no")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_trained_dream_is_saved_in_dreams_format(tmp_path):
    """The final Dream model writes rope_theta (Dream's code reads no rope_parameters and would fall back to 1e4),
    its auto_map and Qwen2 weight names; it loads back to the same logits."""
    import json

    from safetensors.torch import load_file
    from transformers import AutoModel

    source = tmp_path / "tiny-dream"
    model = make_dream()
    model.config.auto_map = {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"}
    model.save_pretrained(source)
    trainer = StableDRLTrainer(
        model=str(source),
        reward_funcs=digit_reward,
        args=make_args(tmp_path, max_steps=1, block_length=None),  # Dream's sampler has no blocks
        train_dataset=make_dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    saved = json.loads((tmp_path / "final" / "config.json").read_text())
    assert saved["rope_theta"] == 1e6 and saved["rope_scaling"] is None and "rope_parameters" not in saved
    assert saved["model_type"] == "Dream" and saved["auto_map"] == model.config.auto_map
    assert sorted(load_file(str(tmp_path / "final" / "model.safetensors"))) == sorted(
        load_file(str(source / "model.safetensors"))
    )
    reloaded = AutoModel.from_pretrained(tmp_path / "final").eval()
    ids = torch.randint(2, 101, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, trainer.model.eval()(ids).logits)
