"""scripts/bench_rollout.py at tiny shapes: the rows, the JSON keys, and token identity of the exact rows."""

from __future__ import annotations

import json

import torch


def test_tiny_run_writes_every_row_and_exact_rows_match(load_script, tmp_path):
    bench = load_script("bench_rollout")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = tmp_path / "rows.json"
        bench.main(["--tiny", "--no-memory", "--json", str(path)])
    finally:
        torch.set_num_threads(threads)
    rows = json.loads(path.read_text())
    modes = ["literal", "previous default"] + [name for name, _ in bench.PACKAGE_MODES]
    for case in ("standard", "early EOS"):
        got = [r for r in rows if r["case"] == case]
        assert [r["mode"] for r in got] == modes
        for r in got:
            assert {"mode", "tokens_per_s", "forward_passes", "peak_mem_mib", "match_rate"} <= set(r)
            assert r["tokens_per_s"] > 0 and r["forward_passes"] > 0
            # at temperature 0 the literal loop, the previous default and every exact speedup decode the same tokens
            if r["mode"] not in bench.APPROXIMATE:
                assert r["match_rate"] == 1.0, r
    by_mode = {r["mode"]: r for r in rows if r["case"] == "early EOS"}
    # half the rows finish at mid-canvas: the early stop saves forwards, the full-canvas rows do not
    assert by_mode["exact"]["forward_passes"] < by_mode["exact: block logits"]["forward_passes"] == 8.0


def test_match_rate_by_hand(load_script):
    bench = load_script("bench_rollout")
    ids = torch.tensor([[5, 6, 0, 9], [5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    ref = torch.tensor([[5, 7, 0, 3], [5, 6, 7, 8]])
    # row 0: positions 0-2 real in both, 1 differs; row 1: all equal -> 6 of 7
    assert abs(bench.match_rate(ids, mask, ref, mask) - 6 / 7) < 1e-12
