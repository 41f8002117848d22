"""scripts/bench_stability.py: the summary statistics by hand, and a miniature study end to end (slow)."""

import json
import math

import pytest


def _history(grad, reward, **per_step):
    rows = []
    for i, (g, r) in enumerate(zip(grad, reward, strict=True)):
        row = {"step": i + 1, "grad_norm": g, "reward": r}
        row.update({k: v[i] for k, v in per_step.items()})
        rows.append(row)
    return rows + [{"step": len(grad), "train_loss": 0.1}]  # TRL's final summary entry is not a step


def test_run_summary_numbers_by_hand(load_script):
    bench = load_script("bench_stability")
    grad = [1.0, 2.0, 1.0, 50.0, 1.5, 16.0]  # median 1.75: 50 is above 17.5, 16 is not
    reward = [0.1, 0.2, 0.3, 0.2, 0.4, 0.5]
    clip = [0.0, 0.5, 1.0, 1.0, 0.25, 0.0]
    weight = [1.0, 3.0, 7.5, 2.0, 1.0, 1.1]
    ess = [8.0, 7.5, 6.0, 8.0, 8.0, 7.9999]
    log = _history(grad, reward, **{"stabledrl/clip_frac": clip, "stabledrl/weight_max": weight, "stabledrl/ess": ess})
    s = bench.run_summary(log, "stable_drl", {0: 0.30, 20: 0.45, 40: 0.40}, group_size=8)
    assert s["steps"] == 6
    assert s["grad_norm_max"] == 50.0 and s["grad_norm_median"] == 1.75
    assert s["spikes"] == 1
    assert s["weight_max"] == 7.5
    assert s["clip_frac"] == pytest.approx(sum(clip) / 6)
    assert s["all_clipped_steps"] == 2 and s["clipped_steps"] == 4
    assert s["ess_min"] == 6.0 and s["ess_below_group_steps"] == 2
    assert (s["accuracy_before"], s["accuracy_after"], s["accuracy_best"]) == (0.30, 0.40, 0.45)
    assert s["reward"] == reward and s["grad_norm"] == grad


def test_clip_fraction_sums_dgpos_two_sides_and_non_finite_norms_are_spikes(load_script):
    bench = load_script("bench_stability")
    log = _history(
        [1.0, float("inf"), 1.0, 1.0],
        [0.0] * 4,
        **{"stabledrl/low_clip_frac": [0.1, 0.2, 0.0, 0.5], "stabledrl/high_clip_frac": [0.1, 0.0, 0.0, 0.5]},
    )
    s = bench.run_summary(log, "dgpo", {0: 0.2, 4: 0.1})
    assert s["clip_frac"] == pytest.approx((0.2 + 0.2 + 0.0 + 1.0) / 4)
    assert s["all_clipped_steps"] == 1
    assert s["spikes"] == 1 and s["nonfinite_grad_norms"] == 1 and s["grad_norm_median"] == 1.0
    assert s["weight_max"] is None  # not logged: reported as missing, not as a number
    assert bench.spikes([]) == 0 and bench.spikes([float("nan")] * 3) == 3


def test_reward_is_read_from_generation_steps_and_every_step_counts_for_grad_norms(load_script):
    bench = load_script("bench_stability")
    # num_iterations 2: TRL logs the reward on every other step only
    log = [
        {"step": 1, "grad_norm": 1.0, "reward": 0.2},
        {"step": 2, "grad_norm": 30.0},
        {"step": 3, "grad_norm": 2.0, "reward": 0.4},
        {"step": 4, "grad_norm": 1.0},
    ]
    s = bench.run_summary(log, "grpo", {0: 0.1, 4: 0.2})
    assert s["steps"] == 4 and s["grad_norm"] == [1.0, 30.0, 2.0, 1.0] and s["reward"] == [0.2, 0.4]
    assert s["grad_norm_max"] == 30.0 and s["spikes"] == 1


def test_mean_over_seeds(load_script):
    bench = load_script("bench_stability")
    a = bench.run_summary(_history([1.0, 3.0], [0.0, 1.0]), "grpo", {0: 0.2, 2: 0.5})
    b = bench.run_summary(_history([2.0, 2.0], [0.5, 0.5]), "grpo", {0: 0.2, 1: 0.6, 2: 0.3})
    m = bench.mean_over_seeds([a, b])
    assert m["seeds"] == 2
    assert m["grad_norm_max"] == pytest.approx(2.5) and m["grad_norm_max_max"] == 3.0
    assert m["accuracy_after"] == pytest.approx(0.4)
    assert (m["accuracy_after_min"], m["accuracy_after_max"]) == (0.3, 0.5)
    assert m["accuracy_best"] == pytest.approx(0.55)
    assert m["reward_last10"] == pytest.approx((0.5 + 0.5) / 2)
    assert m["clip_frac"] is None  # grpo's clip metric absent from these logs


def test_diagnostics_and_clipped_updates_are_read_from_the_logs(load_script):
    bench = load_script("bench_stability")
    log = _history(
        [0.5, 2.0, 1.0, 3.0],
        [0.0] * 4,
        **{
            "stabledrl/weight_mean_neg_adv": [1.2, 1.0, 0.8, 1.0],
            "stabledrl/weight_mean_pos_adv": [0.5, 0.7, 0.9, 0.7],
            "stabledrl/equal_reward_group_frac": [0.25, 0.5, 0.0, 0.25],
        },
    )
    s = bench.run_summary(log, "grpo", {0: 0.2, 4: 0.3}, max_grad_norm=1.0)
    assert s["grad_clipped_steps"] == 2  # 2.0 and 3.0 exceed max_grad_norm; 1.0 does not
    d = s["diagnostics"]
    assert d["weight_mean_neg_adv"] == pytest.approx(1.0) and d["weight_mean_pos_adv"] == pytest.approx(0.7)
    assert d["equal_reward_group_frac"] == pytest.approx(0.25)
    assert d["estimator_noise_std"] is None  # not logged: missing, not a number
    m = bench.mean_over_seeds([s, bench.run_summary(log, "grpo", {0: 0.2, 4: 0.5}, max_grad_norm=1.0)])
    assert m["gain"] == pytest.approx(0.2) and m["gain_std"] == pytest.approx(0.2 / 2**0.5)
    half = 12.7062 * 0.2 / 2**0.5 / 2**0.5  # t_{1, 0.975} * std / sqrt(2)
    assert m["gain_ci95"] == (pytest.approx(0.2 - half, abs=1e-4), pytest.approx(0.2 + half, abs=1e-4))
    assert m["diagnostics"]["weight_mean_neg_adv"] == pytest.approx(1.0) and m["grad_clipped_steps"] == 2


def _run(objective, seed, after, before=0.3):
    return {"objective": objective, "seed": seed, "accuracy_after": after, "accuracy_before": before}


def test_paired_comparison_by_hand(load_script):
    bench = load_script("bench_stability")
    runs = [_run("grpo_seq", s, a) for s, a in zip(range(4), [0.30, 0.25, 0.28, 0.20])]
    runs += [_run("stable_drl", s, a) for s, a in zip(range(5), [0.35, 0.30, 0.30, 0.30, 0.9])]  # seed 4 unpaired
    c = bench.paired_comparison(runs, "stable_drl")
    assert c["seeds"] == [0, 1, 2, 3]
    assert c["differences"] == pytest.approx([0.05, 0.05, 0.02, 0.10])
    t = c["t_test"]  # mean 0.055, std sqrt(0.0033 / 3)
    assert t["mean"] == pytest.approx(0.055) and t["std"] == pytest.approx((0.0033 / 3) ** 0.5)
    assert t["t"] == pytest.approx(0.055 / ((0.0033 / 3) ** 0.5 / 2)) and t["df"] == 3
    assert c["sign_test"]["positive"] == 4 and c["sign_test"]["p"] == pytest.approx(2 / 16)
    assert bench.paired_comparison(runs[:1] + runs[4:5], "stable_drl") is None  # one pair: no test


def test_regime_flags_and_any_config_field(load_script):
    bench = load_script("bench_stability")
    args = bench.parse_args(
        ["--num-generations", "16", "--mc-samples", "1", "--learning-rate", "3e-5", "--estimator", "coupled",
         "--mc-samples", "2", "--set", "clip_c=3", "estimator_block_size=8", "sandwich=false"]
    )  # fmt: skip
    assert args.regime == {
        "num_generations": 16, "per_device_train_batch_size": 64, "mc_samples": 2, "learning_rate": 3e-5,
        "likelihood_estimator": "coupled",
    }  # fmt: skip
    assert args.overrides == {"clip_c": 3.0, "estimator_block_size": 8, "sandwich": False}
    settings = bench.run_settings(bench.OBJECTIVES["grpo_seq"], "grpo_seq", args)
    assert settings["likelihood_estimator"] == "coupled" and settings["num_generations"] == 16
    assert settings["importance_sampling_level"] == "sequence"
    own = bench.run_settings(bench.OBJECTIVES["diffu_grpo"], "diffu_grpo", args)
    assert own["likelihood_estimator"] == "mean_field" and own["mc_samples"] == 1  # d1's own estimator
    assert (args.seeds, args.max_steps, args.eval_draws) == (bench.DEFAULT_SEEDS, bench.DEFAULT_STEPS, 4)
    assert len(args.seeds) >= 5
    with pytest.raises(SystemExit, match="StableDRLConfig field"):
        bench.parse_args(["--set", "no_such_field=1"])
    with pytest.raises(SystemExit, match="own flag"):
        bench.parse_args(["--set", "learning_rate=1e-3"])
    with pytest.raises(SystemExit, match="smoke test"):
        bench.parse_args(["--quick", "--write-readme"])


def test_objective_fields_are_valid_configs(load_script, tmp_path):
    from stabledrl_trl import StableDRLConfig

    bench = load_script("bench_stability")
    args = bench.parse_args([])
    for name, fields in {**bench.OBJECTIVES, **bench.EXTRA_OBJECTIVES}.items():
        config = StableDRLConfig(output_dir=str(tmp_path), use_cpu=True, **bench.run_settings(fields, name, args))
        assert config.loss_type == fields["loss_type"]
    assert {"grpo_seq", "stable_drl", "grpo_seq_shared", "grpo_seq_delta", "stable_drl_no_clip", "dgpo",
            "diffu_grpo"} <= set(bench.OBJECTIVES)  # fmt: skip
    assert bench.OBJECTIVES["stable_drl_no_clip"]["clip_c"] >= 1e6 and bench.OBJECTIVES["grpo_seq_delta"]["delta"]


@pytest.mark.slow
def test_miniature_study_writes_summary_figure_and_readme_block(load_script, tmp_path):
    bench = load_script("bench_stability")
    out = tmp_path / "study"
    summary = bench.main(
        [
            "--quick", "--output-dir", str(out), "--runs-dir", str(tmp_path / "runs"),
            "--sft-cache-dir", str(tmp_path / "sft"), "--sft-steps", "40", "--objectives", "grpo_seq", "stable_drl",
            "--seeds", "0", "1", "--max-steps", "4", "--eval-every", "2", "--eval-samples", "8",
        ]
    )  # fmt: skip
    on_disk = json.loads((out / "bench_stability_summary.json").read_text())
    assert (out / "stability.png").stat().st_size > 1000
    assert on_disk["provenance"]["command"].startswith("python scripts/bench_stability.py --quick --output-dir")
    assert on_disk["settings"]["eval_draws"] == 2 and on_disk["settings"]["quick"]
    assert set(on_disk["objectives"]) == {"grpo_seq", "stable_drl"}
    assert len(on_disk["runs"]) == 4 == len(summary["runs"])
    for run in on_disk["runs"]:
        # num_iterations 2: a grad norm every step, a reward every generation (every other step)
        assert run["steps"] == 4 and len(run["grad_norm"]) == 4 and len(run["reward"]) == 2
        assert sorted(int(k) for k in run["accuracies"]) == [0, 2, 4]  # before, every 2 steps, after
        for step, draws in run["accuracy_draws"].items():
            assert len(draws) == 2 and run["accuracies"][step] == pytest.approx(sum(draws) / 2)
        assert run["greedy_before"] is not None and run["greedy_after"] is not None
        assert run["spikes"] == bench.spikes(run["grad_norm"])
        assert run["grad_norm_max"] == max(run["grad_norm"]) and math.isfinite(run["grad_norm_max"])
        assert run["weight_max"] is not None and run["weight_max"] > 0
    # the same SFT start: accuracy before RL is the same for every run; the RL seed changes the runs
    assert len({r["accuracy_before"] for r in on_disk["runs"]}) == 1
    sd = [r for r in on_disk["runs"] if r["objective"] == "stable_drl"]
    assert sd[0]["weight_max"] != sd[1]["weight_max"]  # the seed changes the masks, so the estimator noise
    assert [r["mask_seed_mode"] for r in sd] == ["fresh", "fresh"]
    c = on_disk["comparisons"]["stable_drl"]
    g = {r["seed"]: r["accuracy_after"] for r in on_disk["runs"] if r["objective"] == "grpo_seq"}
    assert c["differences"] == pytest.approx([r["accuracy_after"] - g[r["seed"]] for r in sd])
    block = bench.readme_blocks(str(out))["stability"]
    assert block == bench.render(on_disk) and "| stable_drl - grpo_seq |" in block and "sign test" in block
    # the estimator noise of the study's own setting, measured with the trainer's scoring, and the distance moved
    noise = on_disk["estimator_noise"]
    assert noise["pairs"] == 64 and set(noise["objectives"]) == {"grpo_seq", "stable_drl"}
    assert (
        noise["objectives"]["stable_drl"]["estimator_block_size"]
        == on_disk["settings"]["study"]["estimator_block_size"]
    )
    assert noise["objectives"]["stable_drl"]["log_ratio_sd"] > 0 and "Estimator noise in this setting" in block
    for run in on_disk["runs"]:  # 4 steps from a 40-step warm-up may see only equal-reward groups: no move at all
        d = run["param_distance"]
        assert d["l2"] >= 0 and math.isfinite(d["l2"]) and (d["l2"] == 0) == (d["relative"] == 0)


def test_parameter_distance_by_hand(load_script):
    import torch

    bench = load_script("bench_stability")
    model = torch.nn.Linear(2, 1, bias=True)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, 0.0]]))
        model.bias.copy_(torch.tensor([4.0]))
    start = {n: p.detach().clone() for n, p in model.named_parameters()}  # norm 5
    with torch.no_grad():
        model.weight.add_(torch.tensor([[1.0, 2.0]]))
        model.bias.add_(torch.tensor([-2.0]))
    d = bench.parameter_distance(model, start)
    assert d["l2"] == pytest.approx(3.0) and d["relative"] == pytest.approx(3.0 / 5.0)
