"""scripts/bench_embedded.py: weight statistics by hand, the README rendering, and a --quick run end to end."""

import json

import pytest


def test_weight_statistics_by_hand(load_script):
    bench = load_script("bench_embedded")
    log = [
        {"step": 1, "grad_norm": 0.5, "stabledrl/ess": 8.0, "stabledrl/clip_frac": 0.0, "stabledrl/weight_max": 1.5},
        {"step": 2, "grad_norm": 2.5, "stabledrl/ess": 6.0, "stabledrl/clip_frac": 0.25, "stabledrl/weight_max": 9.0},
        {"step": 3, "grad_norm": 1.0, "stabledrl/ess": 7.5, "stabledrl/clip_frac": 0.0, "stabledrl/weight_max": 2.0},
        {"step": 3, "train_loss": 0.1},  # TRL's final summary: not a step
    ]
    s = bench.weight_statistics(log, group_size=8)
    assert s == {
        "steps": 3, "ess_below_group_steps": 2, "ess_min": 6.0, "clipped_steps": 1, "weight_max": 9.0,
        "weight_max_median": 2.0, "grad_norm_max": 2.5,
    }  # fmt: skip
    bare = bench.weight_statistics([{"step": 1, "grad_norm": 1.0}], group_size=8)
    assert bare["ess_min"] is None and bare["weight_max"] is None and bare["clipped_steps"] is None


@pytest.mark.slow
def test_quick_run_writes_json_and_renders_its_block(load_script, tmp_path, capsys, monkeypatch):
    bench = load_script("bench_embedded")
    real = bench.config_path
    monkeypatch.setattr(bench, "config_path", lambda n: str(tmp_path / "absent.yaml") if n == "tiny_moe" else real(n))
    docs = tmp_path / "docs"
    argv = [
        "--quick", "--configs", "tiny_noisy", "tiny_moe", "--seeds", "0", "1", "--docs-dir", str(docs),
        "--runs-dir", str(tmp_path / "runs"), "--sft-cache-dir", str(tmp_path / "sft"),
    ]  # fmt: skip
    written = bench.main(argv)
    assert "skipping tiny_moe: configs/tiny_moe.yaml does not exist" in capsys.readouterr().out
    assert set(written) == {"tiny_noisy"} and not (docs / "embedded_tiny_moe.json").exists()
    summary = json.loads((docs / "embedded_tiny_noisy.json").read_text())
    p = summary["provenance"]
    assert p["command"].startswith("python scripts/bench_embedded.py --quick --configs tiny_noisy")
    assert set(p["versions"]) == {"python", "torch", "transformers", "trl"} and "dirty" in p
    assert summary["settings"]["likelihood_estimator"] == "block_random" and summary["quick"]
    assert [r["seed"] for r in summary["runs"]] == [0, 1]
    for r in summary["runs"]:
        assert r["steps"] == 2 and r["ess_min"] is not None  # tiny_noisy's weights are estimator noise
        for side in ("before", "after"):
            acc = r[side]
            assert len(acc["draws"]) == 4 and acc["seeds"] == [r["seed"] + d for d in range(4)]
            assert acc["mean"] == pytest.approx(sum(acc["draws"]) / 4)
            assert 0.0 <= acc["greedy"] <= 1.0 and acc["n"] == 16
        assert r["gain"] == pytest.approx(r["after"]["mean"] - r["before"]["mean"])
    assert summary["mean"]["gain"] == pytest.approx(sum(r["gain"] for r in summary["runs"]) / 2)
    block = bench.readme_blocks(str(docs))["embedded_tiny_noisy"]
    assert block == bench.render(summary)
    assert "| 0 | " in block and "| mean | " in block and "min ESS" in block and p["command"] in block
    with pytest.raises(SystemExit, match="smoke test"):
        bench.main(["--quick", "--write-readme"])
    # --readme-only re-renders the README's blocks from the JSON without running anything
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- embedded_tiny_noisy:start -->\nstale 0.5\n<!-- embedded_tiny_noisy:end -->\n")
    monkeypatch.setattr(bench.results, "README", str(readme))
    bench.main(["--readme-only", "--docs-dir", str(docs)])
    assert bench.results.marked_blocks(readme.read_text()) == {"embedded_tiny_noisy": block}


def test_tuned_on_seeds_tested_apart(load_script):
    """--tuned-on: the gain is also tested over the seeds not used to choose the settings (paired t by hand)."""
    import argparse
    import statistics

    bench = load_script("bench_embedded")

    def run(seed, before, after):
        acc = {"mean": before, "std": 0.0, "greedy": before, "draws": [before], "n": 4, "temperature": 1.0}
        return {"seed": seed, "before": acc, "after": {**acc, "mean": after, "greedy": after}, "gain": after - before,
                "seconds": 1, "ess_below_group_steps": None, "clipped_steps": None, "ess_min": None,
                "weight_max": None, "weight_max_median": None, "grad_norm_max": None}  # fmt: skip

    runs = [run(0, 0.5, 0.9), run(1, 0.5, 0.6), run(2, 0.5, 0.55), run(3, 0.5, 0.58)]
    args = argparse.Namespace(quick=False, eval_draws=1, tuned_on_seeds=[0])
    versions = dict.fromkeys(("python", "torch", "transformers", "trl"), "x")
    provenance = {"commit": "a" * 40, "dirty": False, "command": "c", "versions": versions}
    summary = bench.summarise("tiny", runs, args, provenance)
    fresh = [0.1, 0.05, 0.08]
    mean, sd = statistics.fmean(fresh), statistics.stdev(fresh)
    assert summary["tuned_on"] == [0]
    assert summary["gain_t_test_fresh"]["n"] == 3
    assert summary["gain_t_test_fresh"]["t"] == pytest.approx(mean / (sd / 3**0.5))
    assert summary["gain_t_test"]["n"] == 4
    text = bench.render(summary)
    assert "The settings were chosen on seed 0; on the 3 other seeds alone the mean gain is +0.077" in text
    p_fresh = summary["gain_t_test_fresh"]["p"]
    assert p_fresh < 0.05 and f"p = {p_fresh:.3f}): a gain significant at the 5% level." in text
    assert bench._significance({"p": 0.2, "mean": 0.1}) == "not significant at the 5% level"
    assert bench._significance({"p": 0.01, "mean": -0.1}) == "a loss significant at the 5% level"
    with pytest.raises(SystemExit, match="--tuned-on-seeds"):
        bench.main(["--configs", "tiny", "--seeds", "1", "2", "--tuned-on-seeds", "0"])
