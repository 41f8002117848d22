"""scripts/bench_rollout.py --write-readme: a small run's JSON renders the speed block (ratios and targets computed
from its rows) and the accuracy block, into a temporary README; targets by hand."""

from __future__ import annotations

import json

import pytest

SMALL = ["--batch-size", "4", "--prompt-length", "8", "--gen-length", "16", "--block-length", "4", "--steps", "8",
         "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--mlp", "64", "--vocab-size", "512", "--threads", "1"]  # fmt: skip


def test_target_wording(load_script):
    bench = load_script("bench_rollout")
    assert bench._target(1.31, 1.3) == "target at least 1.3x: met"
    assert bench._target(1.29, 1.3) == "target at least 1.3x: not met"
    assert bench._target(0.061, 0.10, at_most=True, fmt="{:.0%}") == "target at most 10%: met"
    assert bench._target(2.0, None) == "" and bench._paren("") == ""


@pytest.mark.slow
def test_small_run_writes_json_and_both_blocks(load_script, tmp_path, monkeypatch):
    bench = load_script("bench_rollout")
    monkeypatch.setitem(bench.ACCURACY_SFT, "max_steps", 3)
    monkeypatch.setitem(bench.ACCURACY_SFT, "num_samples", 64)
    readme = tmp_path / "README.md"
    readme.write_text(
        "<!-- bench_rollout_small:start -->\nold\n<!-- bench_rollout_small:end -->\n"
        "<!-- bench_rollout_small_accuracy:start -->\nold\n<!-- bench_rollout_small_accuracy:end -->\n"
    )
    monkeypatch.setattr(bench.results, "README", str(readme))
    docs = tmp_path / "docs"
    argv = [*SMALL, "--memory-vocab", "1024", "--accuracy-seeds", "0", "--accuracy-rows", "16", "--sft-cache-dir",
            str(tmp_path / "sft"), "--tag", "small", "--docs-dir", str(docs), "--write-readme"]  # fmt: skip
    bench.main(argv)
    data = json.loads((docs / "bench_rollout_small.json").read_text())
    blocks = bench.results.marked_blocks(readme.read_text())
    assert blocks == bench.readme_blocks(str(docs))
    assert set(blocks) == {"bench_rollout_small", "bench_rollout_small_accuracy"}
    rows = {(r["case"], r["mode"]): r for r in data["rows"]}
    assert len(rows) == 16 and data["parameters"] == {"head": 512 * 32, "layers": data["parameters"]["layers"]}
    ex, prev = rows[("standard", "exact")], rows[("standard", "previous default")]
    ratio = ex["tokens_per_s"] / prev["tokens_per_s"]
    verdict = "met" if ratio >= 1.3 else "not met"
    speed = blocks["bench_rollout_small"]
    assert f"- standard: `exact` is {ratio:.2f}x the previous default (target at least 1.3x: {verdict})" in speed
    m = data["memory_vocab"]["peak_mem_mib"]
    assert f"exact {m['exact']:.0f} MiB ({m['exact'] / m['previous default']:.2f}x; target at most 0.25x:" in speed
    assert "- The exact rows decode the same tokens as `exact` at temperature 0: all of them (match 1.000)." in speed
    accuracy = data["accuracy"]
    assert accuracy["seeds"] == [0] and accuracy["rows"] == 16 and "literal" not in accuracy["modes"]
    exact_acc, exact_fwd = accuracy["modes"]["exact"]["accuracy"][0], accuracy["modes"]["exact"]["forwards"][0]
    row = f"| exact | {exact_acc:.3f} |  | {exact_fwd:.2f} | {exact_acc:.3f} |"
    assert row in blocks["bench_rollout_small_accuracy"]
    with pytest.raises(SystemExit, match="not README results"):
        bench.main(["--tiny", "--write-readme"])
