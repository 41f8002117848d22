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


@pytest.mark.slow
def test_miniature_study_writes_summary_and_figure(load_script, tmp_path):
    bench = load_script("bench_stability")
    out = tmp_path / "study"
    summary = bench.main(
        [
            "--output-dir", str(out), "--sft-cache-dir", str(tmp_path / "sft"), "--sft-steps", "150",
            "--objectives", "grpo_seq", "stable_drl", "--seeds", "0", "1", "--max-steps", "4",
            "--eval-every", "2", "--eval-samples", "16",
        ]
    )  # fmt: skip
    on_disk = json.loads((out / "summary.json").read_text())
    assert (out / "stability.png").stat().st_size > 1000
    assert set(on_disk["objectives"]) == {"grpo_seq", "stable_drl"}
    assert len(on_disk["runs"]) == 4 == len(summary["runs"])
    for run in on_disk["runs"]:
        # num_iterations 2: a grad norm every step, a reward every generation (every other step)
        assert run["steps"] == 4 and len(run["grad_norm"]) == 4 and len(run["reward"]) == 2
        assert sorted(int(k) for k in run["accuracies"]) == [0, 2, 4]  # before, every 2 steps, after
        assert all(0.0 <= a <= 1.0 for a in run["accuracies"].values())
        assert run["spikes"] == bench.spikes(run["grad_norm"])
        assert run["grad_norm_max"] == max(run["grad_norm"]) and math.isfinite(run["grad_norm_max"])
        assert run["weight_max"] is not None and run["weight_max"] > 0
    # the same SFT start: accuracy before RL is the same for every run; the RL seed changes the runs
    assert len({r["accuracy_before"] for r in on_disk["runs"]}) == 1
    sd = [r for r in on_disk["runs"] if r["objective"] == "stable_drl"]
    assert sd[0]["grad_norm"] != sd[1]["grad_norm"]
    assert [r["mask_seed_mode"] for r in sd] == ["fresh", "fresh"]
