"""scripts/bench_eos_tail.py: the README rendering by hand, and a small --write-readme run (a 2-step SFT model) whose
masked and visible estimates agree exactly on the rows without an EOS tail."""

from __future__ import annotations

import json

import pytest


def _row(**kw):
    row = dict(rows=4, rows_with_tail=2, tail_length_mean=1.5, elbo_visible=-1.0, elbo_masked=-1.25, diff_mean=-0.5,
               abs_diff_mean=0.5, abs_diff_max=0.75, no_tail_abs_diff_max=0.0, estimator_sd_k2=0.25)  # fmt: skip
    return {**row, **kw}


def test_render_by_hand(load_script):
    bench = load_script("bench_eos_tail")
    data = {
        "provenance": {"commit": "0123456789abc", "dirty": False, "command": "python scripts/bench_eos_tail.py",
                       "versions": {"python": "3", "torch": "2", "transformers": "5", "trl": "1"}},
        "settings": {"samples": 16, "canvas": 8, "block_size": 2, "rows": 4},
        "temperature": 0.9, "p_mask_prompt": 0.15,
        "rows": {"sft": _row(), "random": _row(rows_with_tail=0, diff_mean=0.0, no_tail_abs_diff_max=0.0)},
    }  # fmt: skip
    text = bench.render(data)
    assert "16 MC masks per estimate" in text and "8-position canvas, estimator blocks of 2" in text
    assert (
        "| SFT warm-up (`configs/tiny.yaml`, 200 steps) | 2/4 | 1.50 | -1.0000 | -1.2500 | -0.500 | 0.500 | 0.750 |"
        in text
    )
    assert "| same architecture, random init | 0/4 |" in text
    assert "changes the per-token ELBO by -0.500 on average over the rows with a tail and a row by up to 0.75" in text
    assert "against a 2-sample estimator sd of 0.25. Rows without a tail: largest difference 0 (unchanged)." in text
    data["rows"]["random"]["no_tail_abs_diff_max"] = 1e-7
    assert "largest difference 1e-07.\n" in bench.render(data)


@pytest.mark.slow
def test_small_run_writes_json_and_block(load_script, tmp_path, monkeypatch):
    bench = load_script("bench_eos_tail")
    monkeypatch.setitem(bench.SFT, "max_steps", 3)
    monkeypatch.setitem(bench.SFT, "num_samples", 64)
    readme = tmp_path / "README.md"
    readme.write_text("<!-- bench_eos_tail:start -->\nold\n<!-- bench_eos_tail:end -->\n")
    monkeypatch.setattr(bench.results, "README", str(readme))
    docs = tmp_path / "docs"
    argv = ["--rows", "16", "--samples", "4", "--sft-cache-dir", str(tmp_path / "sft"), "--output-dir",
            str(tmp_path / "out"), "--docs-dir", str(docs), "--write-readme"]  # fmt: skip
    rows = bench.main(argv)
    data = json.loads((docs / "bench_eos_tail.json").read_text())
    assert data["rows"] == rows and set(rows) == {"sft", "random"}
    for r in rows.values():
        assert r["rows"] == 16 and 0 <= r["rows_with_tail"] <= 16
        assert r["no_tail_abs_diff_max"] == 0.0  # only the tail differs: rows without one are unchanged
        assert r["abs_diff_max"] >= r["abs_diff_mean"] >= abs(r["diff_mean"])
    assert bench.results.marked_blocks(readme.read_text()) == {"bench_eos_tail": bench.render(data)}
