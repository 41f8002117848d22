"""StableDRLConfig: defaults, and every bad value fails at construction with the field, the value and the fix."""

import pytest
from trl import GRPOConfig

from stabledrl_trl.stabledrl_config import CHANGED_GRPO_DEFAULTS, StableDRLConfig


def make(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=64,
        block_length=32,
        diffusion_steps=32,
        report_to="none",
    )
    base.update(kw)
    return StableDRLConfig(**base)


def test_mc_samples_unset_takes_the_estimators_default_and_set_values_are_kept(tmp_path):
    expected = {
        "mean_field": 1,
        "mc_elbo": 2,
        "block_random": 2,
        "block_random_coupled": 2,
        "coupled": 2,
        "sdmc": 3,
        "sdmc_coupled": 6,
    }
    for name, k in expected.items():
        assert make(tmp_path, likelihood_estimator=name).num_mc_samples == k, name
    assert make(tmp_path, likelihood_estimator="sdmc", sdmc_nodes=5).num_mc_samples == 5
    assert make(tmp_path, likelihood_estimator="sdmc_coupled", sdmc_nodes=2, mc_samples=8).num_mc_samples == 8
    assert make(tmp_path, likelihood_estimator="mean_field", mc_samples=1).num_mc_samples == 1
    assert make(tmp_path, likelihood_estimator="block_random_coupled", mc_samples=4, sandwich=True).num_mc_samples == 4


def test_is_a_grpo_config_with_documented_changed_defaults(tmp_path):
    cfg = make(tmp_path)
    assert isinstance(cfg, GRPOConfig)
    assert cfg.loss_type == "stable_drl" and cfg.scale_rewards == "none" and cfg.temperature == 0.9
    assert cfg.clip_c == 5.0 and cfg.mc_samples is None and cfg.num_mc_samples == 2
    assert cfg.likelihood_estimator == "block_random"
    plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    for name, (old, new, _why) in CHANGED_GRPO_DEFAULTS.items():
        assert getattr(plain, name) == old, name
        assert StableDRLConfig.__dataclass_fields__[name].default == new, name


def test_every_new_field_is_documented():
    new = set(StableDRLConfig.__dataclass_fields__) - set(GRPOConfig.__dataclass_fields__)
    assert {"clip_c", "likelihood_estimator", "mask_seed_mode", "block_length", "diffusion_steps"} <= new
    for name in new | set(CHANGED_GRPO_DEFAULTS):
        assert StableDRLConfig.__dataclass_fields__[name].metadata.get("help"), name


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(max_completion_length=60, block_length=32), ["block_length=32", "max_completion_length=60", "30"]),
        (
            dict(max_completion_length=64, block_length=32, diffusion_steps=33),
            ["diffusion_steps=33", "multiple of", "= 2", "diffusion_steps=32"],
        ),
        (dict(max_completion_length=8, block_length=4, diffusion_steps=16), ["diffusion_steps=16", "<= 8"]),
        (dict(num_iterations=0), ["num_iterations=0", "num_iterations=1"]),
        (dict(loss_type="ppo"), ["loss_type", "ppo", "stable_drl"]),
        (dict(likelihood_estimator="exact"), ["likelihood_estimator", "exact", "block_random"]),
        (dict(clip_c=1.0), ["clip_c", "1.0", "5.0"]),
        (dict(clip_c=0.5), ["clip_c", "0.5"]),
        (dict(loss_type="stable_drl_ratio", epsilon=1.5), ["epsilon", "1.5", "(0, 1)"]),
        (dict(loss_type="stable_drl_ratio", epsilon=0.0), ["epsilon", "0.0"]),
        (dict(loss_type="dgpo", epsilon_high=1.0), ["epsilon_high", "1.0"]),
        (dict(mc_samples=0), ["mc_samples", "0", ">= 1"]),
        (dict(p_mask_prompt=1.0), ["p_mask_prompt", "1.0", "[0, 1)"]),
        (dict(p_mask_prompt=-0.1), ["p_mask_prompt", "-0.1"]),
        (dict(likelihood_estimator="coupled", mc_samples=3), ["mc_samples", "3", "even"]),
        (dict(likelihood_estimator="block_random_coupled", mc_samples=5), ["mc_samples=5", "even", "mc_samples=6"]),
        (
            dict(likelihood_estimator="mean_field", mc_samples=2),
            ["mc_samples=2", "mean_field", "one forward pass", "mc_samples=1"],
        ),
        (dict(likelihood_estimator="sdmc", mc_samples=4), ["mc_samples=4", "multiple of 3", "sdmc_nodes=3"]),
        (
            dict(likelihood_estimator="sdmc_coupled", sdmc_nodes=2, mc_samples=6),
            ["mc_samples=6", "multiple of 4", "mc_samples=8"],
        ),
        (dict(likelihood_estimator="sdmc", sdmc_nodes=6), ["sdmc_nodes=6", "[1, 5]"]),
        (dict(likelihood_estimator="sdmc", sdmc_nodes=0), ["sdmc_nodes=0", "[1, 5]"]),
        (dict(sdmc_nodes=2), ["sdmc_nodes=2", "'sdmc'", "'block_random'"]),
        (dict(sandwich=True, likelihood_estimator="sdmc"), ["sandwich", "block_random_coupled"]),
        (dict(mask_seed_mode="sometimes"), ["mask_seed_mode", "sometimes", "fresh"]),
        (dict(remasking="topk"), ["remasking", "topk"]),
        (dict(sandwich=True, likelihood_estimator="mc_elbo"), ["sandwich", "block_random"]),
        (dict(sandwich=True, loss_type="dgpo"), ["sandwich", "stable_drl"]),
        (dict(sandwich_beta=0.0), ["sandwich_beta", "1.5"]),
        (dict(dgpo_n=0.0), ["dgpo_n"]),
        (dict(estimator_chunk_size=0), ["estimator_chunk_size", "0"]),
        (
            dict(per_device_train_batch_size=6, num_generations=4),
            ["per_device_train_batch_size", "6", "multiple of 4"],
        ),
        (dict(rollout_cache="full"), ["rollout_cache", "full", "prefix", "dual"]),
        (dict(parallel_threshold=1.0), ["parallel_threshold", "1.0", "0.9"]),
        (dict(parallel_threshold=0.0), ["parallel_threshold", "0.0"]),
        (dict(max_tokens_per_step=4), ["max_tokens_per_step", "4", "parallel_threshold"]),
        (dict(parallel_threshold=0.9, max_tokens_per_step=0), ["max_tokens_per_step", "0"]),
        (dict(stable_drl_ratio_form="max"), ["stable_drl_ratio_form", "max", "mean"]),
        (dict(eos_tail="hidden"), ["eos_tail", "hidden", "masked"]),
        (dict(completion_end="eot"), ["completion_end", "eot", "tokenizer_eos"]),
        (dict(all_clipped_patience=-1), ["all_clipped_patience", "-1"]),
        # sampler choice and Dream's sampler
        (dict(diffusion_sampler="fast"), ["diffusion_sampler", "fast", "'dream'"]),
        (dict(dream_alg="low_confidence"), ["alg", "low_confidence", "entropy"]),
        (dict(dream_alg_temp=-1.0), ["alg_temp", "-1.0"]),
        (dict(dream_alg="origin", dream_alg_temp=0.5), ["alg_temp", "origin"]),
        (dict(dream_eps=1.5), ["eps", "1.5", "[0, 1)"]),
        (dict(diffusion_sampler="dream", remasking="random"), ["remasking", "random", "dream_alg"]),
        (dict(diffusion_sampler="dream", cfg_scale=1.0), ["cfg_scale", "guidance"]),
        (dict(diffusion_sampler="llada", dream_alg="maskgit_plus"), ["dream_alg", "maskgit_plus", "'dream'"]),
        # reward text
        (dict(reward_text="full"), ["reward_text", "full", "'canvas'", "'completion'"]),
        (dict(diffusion_sampler="dream", parallel_threshold=0.9), ["parallel_threshold", "Dream", "'llada'"]),
        (dict(diffusion_sampler="dream", rollout_cache="prefix"), ["rollout_cache", "Dream"]),
    ],
)
def test_bad_values_fail_at_construction(tmp_path, kwargs, words):
    with pytest.raises(ValueError) as info:
        make(tmp_path, **kwargs)
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)


def test_num_generations_below_two_rejected(tmp_path):
    with pytest.raises(ValueError, match="num_generations"):
        make(tmp_path, num_generations=1, per_device_train_batch_size=4)


def test_trl_loss_types_accept_any_layout(tmp_path):
    # TRL's own objectives do not normalise per group, so a micro-batch may split a group.
    cfg = make(
        tmp_path,
        loss_type="grpo",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_generations=4,
        beta=0.04,
    )
    assert cfg.loss_type == "grpo" and cfg.beta == 0.04


# ---------------------------------------------------------------------------------------------- ratio pairing


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(), "fresh"),  # official stable_drl
        (dict(loss_type="dgpo"), "shared"),
        (dict(loss_type="dapo"), "shared"),
        (dict(loss_type="grpo", importance_sampling_level="sequence"), "shared"),
        (dict(loss_type="stable_drl_ratio"), "shared"),
        (dict(loss_type="grpo", beta=0.04, likelihood_estimator="mean_field"), "shared"),
    ],
)
def test_unset_mask_seed_mode_is_picked_per_objective_and_recorded(tmp_path, kwargs, expected):
    cfg = make(tmp_path, **kwargs)
    assert cfg.mask_seed_mode == expected
    assert cfg.to_dict()["mask_seed_mode"] == expected
    # the recorded value rebuilds the same config (no second guess)
    again = make(tmp_path, **{**kwargs, "mask_seed_mode": cfg.mask_seed_mode})
    assert again.mask_seed_mode == expected


def test_auto_mask_seed_mode_is_reported_once(tmp_path, caplog):
    from stabledrl_trl import stabledrl_config

    stabledrl_config._REPORTED_AUTO_MASK_MODES.clear()
    with caplog.at_level("WARNING", logger="stabledrl_trl.stabledrl_config"):
        make(tmp_path, loss_type="dgpo")
        make(tmp_path, loss_type="dgpo")
    picked = [r for r in caplog.records if "mask_seed_mode='shared'" in r.getMessage()]
    assert len(picked) == 1 and "dgpo" in picked[0].getMessage()


@pytest.mark.parametrize(
    "kwargs, fixes",
    [
        (dict(loss_type="dapo"), ["importance_sampling_level='sequence'"]),
        (dict(loss_type="grpo"), ["importance_sampling_level='sequence'"]),
        (dict(loss_type="dgpo"), []),
        (dict(loss_type="stable_drl_ratio", stable_drl_ratio_form="sum"), ["stable_drl_ratio_form='mean'"]),
        (dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.04), ["KL"]),
        (dict(loss_type="dgpo", likelihood_estimator="mc_elbo"), []),
        (dict(loss_type="dgpo", likelihood_estimator="mean_field"), []),  # prompt masked w.p. 0.15 by default
    ],
)
def test_per_token_ratios_with_fresh_random_masks_are_refused_with_the_fix(tmp_path, kwargs, fixes):
    with pytest.raises(ValueError) as info:
        make(tmp_path, mask_seed_mode="fresh", **kwargs)
    message = str(info.value)
    for word in ["loss_type", "mask_seed_mode='fresh'", "mask_seed_mode='shared'", "allow_noisy_token_ratios", *fixes]:
        assert word in message, (word, message)
    # the explicit opt-in for studies
    cfg = make(tmp_path, mask_seed_mode="fresh", allow_noisy_token_ratios=True, **kwargs)
    assert cfg.mask_seed_mode == "fresh"


@pytest.mark.parametrize(
    "kwargs",
    [
        # the paper's GRPO baseline: sequence-level ratios, any estimator, both mask modes
        *[
            dict(loss_type="grpo", importance_sampling_level="sequence", likelihood_estimator=e, mask_seed_mode=m)
            for e in ("mean_field", "mc_elbo", "mc_elbo_inv_t", "block_random", "coupled")
            for m in ("fresh", "shared")
        ],
        dict(loss_type="stable_drl_ratio", mask_seed_mode="fresh"),  # form "mean": exp(L_theta - L_old)
        dict(loss_type="stable_drl", mask_seed_mode="shared"),
        # the deterministic estimator: fresh and shared masks are the same masks
        dict(loss_type="dgpo", likelihood_estimator="mean_field", p_mask_prompt=0.0, mask_seed_mode="fresh"),
        # an autoregressive model has exact per-token log-probs
        dict(loss_type="dapo", diffusion=False, mask_seed_mode="fresh"),
    ],
)
def test_meaningful_pairings_are_accepted(tmp_path, kwargs):
    cfg = make(tmp_path, **kwargs)
    assert cfg.mask_seed_mode == kwargs["mask_seed_mode"]


@pytest.mark.parametrize(
    "length, block, steps",
    [
        (256, 32, 128),  # the official recipe: 8 blocks of 32, 2 tokens per step
        (8, 8, 4),  # shorter than a block: one block of the whole length
        (1, 1, 1),  # never fewer than one step per block, never more steps than positions
        (3, 3, 1),
        (60, 30, 30),  # 32 does not divide 60: the largest divisor <= 32
        (100, 25, 48),  # 4 blocks; 50 steps rounded down to a multiple of 4
        (512, 32, 256),
    ],
)
def test_unset_diffusion_fields_take_length_derived_defaults(tmp_path, length, block, steps):
    cfg = make(tmp_path, max_completion_length=length, block_length=None, diffusion_steps=None)
    assert (cfg.block_length, cfg.diffusion_steps) == (block, steps)
    assert length % block == 0 and steps % (length // block) == 0 and steps <= length


def test_explicit_block_length_keeps_it_and_derives_steps(tmp_path):
    cfg = make(tmp_path, max_completion_length=64, block_length=8, diffusion_steps=None)
    assert (cfg.block_length, cfg.diffusion_steps) == (8, 32)


def test_defaults_fit_a_short_completion_length(tmp_path):
    # A plain GRPOConfig-style call with only a short length: no diffusion field to set by hand.
    cfg = StableDRLConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", max_completion_length=8
    )
    assert (cfg.block_length, cfg.diffusion_steps) == (8, 4)
    official = StableDRLConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    assert (official.max_completion_length, official.block_length, official.diffusion_steps) == (256, 32, 128)


def test_diffusion_fields_are_not_checked_for_an_autoregressive_model(tmp_path):
    cfg = make(tmp_path, diffusion=False, max_completion_length=8, block_length=32, diffusion_steps=128)
    assert cfg.block_length == 32  # unused by an autoregressive model, left as given


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(num_generations=8.0, per_device_train_batch_size=8), ["num_generations=8.0", "integer", "write 8"]),
        (dict(num_generations=[4]), ["num_generations=[4]", "integer"]),
        (dict(num_generations=None), ["num_generations=None", "default 8"]),
        (dict(max_steps=2.5), ["max_steps=2.5", "integer"]),
        (dict(learning_rate="fast"), ["learning_rate='fast'", "number"]),
        (dict(diffusion_steps=4.0), ["diffusion_steps=4.0", "integer"]),
    ],
)
def test_wrong_types_from_yaml_fail_at_construction(tmp_path, kwargs, words):
    with pytest.raises(TypeError) as info:
        make(tmp_path, **kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_integers_for_float_fields_and_none_where_default_is_none_are_accepted(tmp_path):
    cfg = make(tmp_path, learning_rate=1, num_generations_eval=None, temperature=1)
    assert cfg.learning_rate == 1 and cfg.num_generations_eval is None


def test_greedy_rollouts_with_several_generations_warn(tmp_path):
    with pytest.warns(UserWarning, match="temperature=0"):
        make(tmp_path, temperature=0.0)


def test_dream_sampler_defaults_and_no_block_layout(tmp_path):
    cfg = make(tmp_path)
    assert (cfg.diffusion_sampler, cfg.dream_alg, cfg.dream_alg_temp, cfg.dream_eps) == ("auto", "entropy", 0.0, 1e-3)
    # Dream's sampler has no blocks: LLaDA's block layout constraints do not apply to it ...
    dream = make(tmp_path, diffusion_sampler="dream", max_completion_length=60, diffusion_steps=7, top_p=0.95,
                 block_length=None)  # fmt: skip
    assert dream.diffusion_sampler == "dream"
    # ... and a block_length set for it would be ignored: refused (the derived default is not "set")
    with pytest.raises(ValueError, match=r"\{'block_length': 32\}: Dream's sampler .* without LLaDA's blocks"):
        make(tmp_path, diffusion_sampler="dream", max_completion_length=60, diffusion_steps=7, block_length=32)
    # ... but they do where LLaDA's sampler may run
    for sampler in ("auto", "llada"):
        with pytest.raises(ValueError, match="block_length"):
            make(tmp_path, diffusion_sampler=sampler, max_completion_length=60, diffusion_steps=7)
    # the "unchanged" checks of one sampler's settings compare against the config's own defaults
    from stabledrl_trl.diffusion.family import BLOCK_SAMPLER_DEFAULTS, DREAM_SAMPLER_DEFAULTS, FAST_ROLLOUT_DEFAULTS
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings

    assert DREAM_SAMPLER_DEFAULTS == {"dream_alg": "entropy", "dream_alg_temp": 0.0, "dream_eps": 1e-3}
    assert FAST_ROLLOUT_DEFAULTS == {"rollout_cache": "none", "parallel_threshold": None, "max_tokens_per_step": None}
    assert BLOCK_SAMPLER_DEFAULTS == {
        "block_denoising_steps": None, "block_remasking": "low_confidence_dynamic", "block_confidence_threshold": 0.9
    }  # fmt: skip
    for defaults in (DREAM_SAMPLER_DEFAULTS, BLOCK_SAMPLER_DEFAULTS, FAST_ROLLOUT_DEFAULTS):
        assert set(defaults) <= set(SamplerSettings.field_names())


def test_no_completion_length_limit_is_kept_for_autoregressive_models(tmp_path):
    # TRL's max_completion_length=None (no limit) stays valid; a diffusion LM is refused it by the trainer.
    cfg = make(tmp_path, max_completion_length=None, block_length=None, diffusion_steps=None)
    assert cfg.max_completion_length is None
    from stabledrl_trl.stabledrl_config import check_diffusion_layout

    with pytest.raises(ValueError, match="max_completion_length=None: a diffusion LM"):
        check_diffusion_layout(None, cfg.block_length, cfg.diffusion_steps)
