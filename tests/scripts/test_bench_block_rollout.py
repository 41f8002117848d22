"""scripts/bench_block_rollout.py at tiny shapes: both rows, identical tokens, for SDAR's and LLaDA2's samplers."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("model", ["sdar", "llada2"])
def test_tiny_run_gives_identical_tokens(load_script, model):
    bench = load_script("bench_block_rollout")
    args = bench.make_parser().parse_args(
        ["--model", model, "--device", "cpu", "--gen-length", "8", "--prompt-length", "5", "--batch-size", "2",
         "--hidden-size", "32", "--layers", "2", "--vocab-size", "64"]
    )  # fmt: skip
    rows = bench.run(args)
    assert [r["mode"] for r in rows] == ["recompute prefix", "KV cache"]
    assert all(r["identical"] for r in rows)
    assert rows[0]["tokens"] == rows[1]["tokens"] == 2 * 8  # no reachable EOS: every row generates everything
    # the cached sampler adds the prefill and a commit forward per finished block
    assert rows[1]["forwards"] > rows[0]["forwards"]
