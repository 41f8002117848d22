"""stabledrl_trl.estimator_noise (pure-noise log-ratios with the trainer's scoring) and stabledrl_trl.noise_dose
(the test-only noise of known size added to the log-ratio)."""

import math

import pytest
import torch
from datasets import Dataset

from stabledrl_trl import StableDRLConfig, StableDRLTrainer
from stabledrl_trl.diffusion.seeding import mix_seed
from stabledrl_trl.estimator_noise import noise_streams, noise_summary, pure_noise_log_ratios, trainer_rollouts
from stabledrl_trl.noise_dose import add_log_ratio_noise, log_ratio_noise
from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict


def _model(seed=0):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**tiny_llada_config_dict())
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)


def _reward(completions, **kwargs):
    return [float(len(str(c))) for c in completions]


def _trainer(tmp_path, **kw):
    args = dict(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=8,
        num_generations=4, gradient_accumulation_steps=1, max_completion_length=8, block_length=8, diffusion_steps=8,
        max_steps=2, learning_rate=1e-3, logging_steps=1, save_strategy="no", gradient_checkpointing=False, seed=7,
        temperature=1.0, loss_type="stable_drl", likelihood_estimator="block_random", mc_samples=2,
        estimator_block_size=2, p_mask_prompt=0.0, mask_seed_mode="fresh", num_iterations=2,
    )  # fmt: skip
    args.update(kw)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"sort {i}{i + 3}"}]} for i in range(6)])
    return StableDRLTrainer(
        model=_model(), reward_funcs=_reward, args=StableDRLConfig(**args), train_dataset=dataset,
        processing_class=build_tiny_tokenizer(),
    )  # fmt: skip


def test_noise_summary_by_hand():
    x = torch.tensor([0.0, math.log(2.0), -math.log(2.0), math.log(10.0)])
    s = noise_summary(x, token_max=torch.tensor([0.0, 1.0, 3.0, 2.5]), clip_c=5.0)
    mean = math.log(10.0) / 4
    sd = math.sqrt(sum((v - mean) ** 2 for v in x.tolist()) / 3)
    assert s["pairs"] == 4 and s["log_ratio_sd"] == pytest.approx(sd) and s["log_ratio_mean"] == pytest.approx(mean)
    assert s["weight_max"] == pytest.approx(10.0) and s["weight_min"] == pytest.approx(0.5)
    assert s["frac_above_clip_c"] == 0.25 and s["frac_below_inv_clip_c"] == 0.0  # only 10 > 5; 1/2 > 1/5
    assert s["token_weight_max"] == pytest.approx(math.exp(3.0)) and s["log_ratio_mean_se"] == pytest.approx(sd / 2)
    with pytest.raises(ValueError, match="at least 2"):
        noise_summary(torch.tensor([0.1]))


def test_streams_are_the_trainers():
    from stabledrl_trl.stabledrl_trainer import _STREAM_ITER, _STREAM_OLD, _STREAM_STEP

    assert noise_streams("fresh", 3, 1) == ((_STREAM_OLD, 3), (_STREAM_STEP, 3, 1))
    assert noise_streams("shared", 3, 1) == ((_STREAM_ITER, 3, 1),) * 2
    with pytest.raises(ValueError, match="mask_seed_mode"):
        noise_streams("auto", 0)


def test_pure_noise_matches_an_independent_estimate_and_shared_masks_give_zero(tmp_path):
    trainer = _trainer(tmp_path)
    prompts = [row["prompt"] for row in trainer.train_dataset][:4]
    pid, pm, cid, cm = trainer_rollouts(trainer, prompts, torch.Generator().manual_seed(0))
    log_r, token_max = pure_noise_log_ratios(trainer, pid, pm, cid, cm, draws=2)
    rows = cm.bool().any(-1)
    assert log_r.shape == (2 * int(rows.sum()),) and log_r.abs().max() > 0  # fresh masks: noise
    # the same pairs computed directly with family.estimate and the trainer's seeds (row keys 0..B-1)
    family, args = trainer._diffusion_family, trainer.args
    expected = []
    for d in range(2):
        values = []
        for stream in noise_streams("fresh", d):
            seeds = mix_seed(torch.arange(pid.shape[0]), args.seed, *stream)
            with torch.no_grad():
                est = family.estimate(trainer._adapter(trainer.model), pid, pm, cid, cm, args, seeds=seeds,
                                      fill_token_id=trainer.processing_class.eos_token_id)  # fmt: skip
            values.append(est.token_logps.double())
        m = cm.bool()
        expected.append((torch.where(m, values[1] - values[0], 0.0).sum(-1) / m.sum(-1).clamp(min=1))[rows])
    assert torch.allclose(log_r, torch.cat(expected), atol=1e-6)
    assert (token_max >= log_r - 1e-9).all()  # the largest token log-ratio bounds the row's mean
    shared = _trainer(tmp_path, mask_seed_mode="shared", loss_type="grpo", importance_sampling_level="sequence")
    saved = (shared._scoring.mask_stream, shared._scoring.mask_rows)
    zero, _ = pure_noise_log_ratios(shared, pid, pm, cid, cm, draws=2)
    assert torch.equal(zero, torch.zeros_like(zero))
    assert (shared._scoring.mask_stream, shared._scoring.mask_rows) == saved  # the trainer's state is restored


def test_log_ratio_noise_has_its_std_and_follows_the_row_not_the_batch():
    keys = torch.arange(4000)
    eps = log_ratio_noise(keys, seed=3, step=5, inner_step=1, std=0.7)
    assert eps.dtype == torch.float64 and eps.shape == (4000,)
    assert eps.std().item() == pytest.approx(0.7, rel=0.05) and abs(eps.mean().item()) < 4 * 0.7 / math.sqrt(4000)
    perm = torch.randperm(4000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(log_ratio_noise(keys[perm], 3, 5, 1, 0.7), eps[perm])  # a row's draw ignores its position
    assert not torch.equal(log_ratio_noise(keys, 3, 5, 0, 0.7), eps)  # a new draw per inner step
    assert torch.equal(log_ratio_noise(keys, 3, 5, 1, 0.0), torch.zeros(4000, dtype=torch.float64))
    with pytest.raises(ValueError, match="test_log_ratio_noise_std"):
        log_ratio_noise(keys, 3, 5, 1, -1.0)


def test_added_noise_moves_every_log_ratio_of_a_row_by_its_draw():
    old = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]).bool()
    current = torch.randn(3, 5)
    noise = torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64)
    out = add_log_ratio_noise({"old_per_token_logps": old, "x": 1}, noise)
    before = ((current - old) * mask).sum(-1) / mask.sum(-1)
    after = ((current - out["old_per_token_logps"]) * mask).sum(-1) / mask.sum(-1)
    assert torch.allclose(after - before, noise.float(), atol=1e-6) and out["x"] == 1
    assert torch.allclose(current - out["old_per_token_logps"] - (current - old), noise.float()[:, None].expand(3, 5))
    with pytest.raises(RuntimeError, match="on-policy"):
        add_log_ratio_noise({"old_per_token_logps": None}, noise)


def test_config_refuses_a_negative_noise_std(tmp_path):
    with pytest.raises(ValueError, match="test_log_ratio_noise_std"):
        StableDRLConfig(output_dir=str(tmp_path), use_cpu=True, test_log_ratio_noise_std=-0.1)


def test_large_test_noise_clips_about_half_of_stabledrls_weights(tmp_path):
    # log w = estimator noise + N(0, 40^2): P(log w > log 5) = P(Z > log 5 / 40) ~ 0.484 (the estimator's own noise,
    # sd ~0.3, is negligible next to 40); without the test noise almost nothing is clipped.
    noisy = _trainer(tmp_path / "a", test_log_ratio_noise_std=40.0, max_steps=4)
    noisy.train()
    clip = [h["stabledrl/clip_frac"] for h in noisy.state.log_history if "stabledrl/clip_frac" in h]
    quiet = _trainer(tmp_path / "b", max_steps=4)
    quiet.train()
    base = [h["stabledrl/clip_frac"] for h in quiet.state.log_history if "stabledrl/clip_frac" in h]
    expected = 0.5 * math.erfc(math.log(5.0) / 40.0 / math.sqrt(2.0))
    assert len(clip) == 4 and abs(sum(clip) / 4 - expected) < 0.2  # 32 weights: binomial sd ~0.09
    assert sum(base) / 4 < 0.1
