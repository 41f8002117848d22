"""scripts/bench_estimators.py: the README table is the rendering of the committed result; a small run end to end."""

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_readme_block_equals_the_rendering_of_the_committed_json(load_script):
    bench = load_script("bench_estimators")
    result = json.loads((ROOT / "docs" / "bench_estimators.json").read_text())
    assert bench.readme_block(bench.results.block_page("bench_estimators")) == bench.render(result)
    # the committed result covers both shapes and every estimator of the grid, with the baseline at 1
    assert [s["name"] for s in result["shapes"]] == ["embedded", "larger"]
    for shape in result["shapes"]:
        measured = [(r["estimator"], r["mc_samples"], r["nodes"]) for r in shape["table"]]
        assert measured == [(g["estimator"], g["mc_samples"], g["nodes"]) for g in bench.settings_grid()]
        base = next(r for r in shape["table"] if (r["estimator"], r["mc_samples"]) == ("block_random", 2))
        assert base["variance_vs_block_random_k2"] == pytest.approx(1.0)
    assert result["commit"] and result["versions"]["torch"] and result["command"].startswith("python scripts/")


def test_settings_grid_and_readme_writing(load_script, tmp_path):
    bench = load_script("bench_estimators")
    grid = bench.settings_grid(ks=(2, 4), nodes=(1, 2, 3))
    names = [(g["estimator"], g["mc_samples"], g["nodes"]) for g in grid]
    assert ("mean_field", 1, None) in names and ("block_random_coupled", 4, None) in names
    assert ("sdmc", 3, 3) in names and ("sdmc_coupled", 4, 2) in names and ("sdmc_coupled", 6, 3) not in names
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{bench.MARK_START}\nold\n{bench.MARK_END}\n\nrest\n")
    bench.write_readme(str(readme), "| a |\n|---|")
    assert bench.readme_block(str(readme)) == "| a |\n|---|"
    assert readme.read_text().endswith(f"{bench.MARK_END}\n\nrest\n")
    bare = tmp_path / "bare.md"
    bare.write_text("no markers")
    with pytest.raises(SystemExit, match="bench_estimators"):
        bench.write_readme(str(bare), "x")


@pytest.mark.slow
def test_small_run_writes_a_consistent_result(load_script, tmp_path):
    bench = load_script("bench_estimators")
    out = tmp_path / "bench.json"
    args = ["--model", "random", "--rows", "6", "--repeats", "2", "--max-passes", "2", "--skip-larger"]
    result = bench.main([*args, "--output", str(out)])
    assert json.loads(out.read_text()) == result
    table = {(r["estimator"], r["mc_samples"]): r for r in result["shapes"][0]["table"]}
    assert table[("mean_field", 1)]["log_ratio_sd"] == 0.0  # no prompt masking: deterministic, no noise
    assert table[("block_random", 2)]["variance_vs_block_random_k2"] == pytest.approx(1.0)
    for r in table.values():
        assert r["passes"] == r["mc_samples"] and math.isfinite(r["log_ratio_sd"])
        if r["estimator"] != "mean_field":
            assert r["log_ratio_sd"] > 0
    assert "random initialisation" in result["shapes"][0]["model"]
