"""scripts/bench_memory.py: the README rendering by hand from a made-up result, and a tiny --write-readme run that
writes the JSON and the block (into a temporary README)."""

from __future__ import annotations

import json

import pytest

MIB = 2**20


def _data(unchunked: bool) -> dict:
    rows = [
        {"k": 1, "peak_bytes": 100 * MIB, "seconds": 0.5},
        {"k": 4, "peak_bytes": 125 * MIB, "seconds": 2.0},
    ]
    if unchunked:
        rows[0].update(unchunked_peak_bytes=80 * MIB, unchunked_seconds=0.4)
        rows[1].update(unchunked_peak_bytes=320 * MIB, unchunked_seconds=1.9)
    settings = dict(estimator="block_random", device="cpu", threads=1, chunk_size=4, d_model=64, n_layers=2,
                    n_heads=2, vocab_size=512, dtype="float32", batch_size=4, prompt_length=8,
                    completion_length=16, repeats=2)  # fmt: skip
    provenance = {"commit": "0123456789abcdef", "dirty": False, "command": "python scripts/bench_memory.py",
                  "versions": {"python": "3", "torch": "2", "transformers": "5", "trl": "1"}}  # fmt: skip
    return {"provenance": provenance, "settings": settings, "model": "LLaDAModelLM", "rows": rows}


def test_render_by_hand(load_script):
    bench = load_script("bench_memory")
    text = bench.render(_data(unchunked=True))
    assert "| K | peak memory (MiB) | x K=1 | time (s) | x K=1 | peak without chunking (MiB) | x K=1 |" in text
    assert "| 1 | 100.0 | 1.00 | 0.50 | 1.00 | 80.0 | 1.00 |" in text
    assert "| 4 | 125.0 | 1.25 | 2.00 | 4.00 | 320.0 | 4.00 |" in text  # 125/100, 2.0/0.5, 320/80
    assert "From K = 1 to K = 4: peak memory 1.25x with chunks of 4 rows, 4.00x without chunking; time 4.00x." in text
    assert "cpu, 1 thread." in text and "(mean of 2 after a warm-up)" in text
    assert text.endswith("at commit 0123456789; Python 3, torch 2, transformers 5, trl 1.\n")
    plain = bench.render(_data(unchunked=False))
    assert "without chunking" not in plain and "| 4 | 125.0 | 1.25 | 2.00 | 4.00 |" in plain


@pytest.mark.slow
def test_tiny_run_writes_json_and_readme_block(load_script, tmp_path, monkeypatch):
    bench = load_script("bench_memory")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- bench_memory:start -->\nold 1.0\n<!-- bench_memory:end -->\nrest\n")
    monkeypatch.setattr(bench.results, "README", str(readme))
    docs = tmp_path / "docs"
    argv = ["--device", "cpu", "--batch-size", "2", "--prompt-length", "8", "--completion-length", "16", "--d-model",
            "32", "--n-layers", "1", "--n-heads", "2", "--samples", "1,2", "--repeats", "1", "--threads", "1",
            "--docs-dir", str(docs), "--write-readme"]  # fmt: skip
    rows = bench.main(argv)
    data = json.loads((docs / "bench_memory.json").read_text())
    assert [r["k"] for r in data["rows"]] == [1, 2] and data["rows"] == rows
    # at this tiny shape the estimate's peak can stay under the process's earlier peak (growth 0, page granularity)
    assert all(r["peak_bytes"] >= 0 and r["unchunked_peak_bytes"] >= 0 and r["seconds"] > 0 for r in rows), rows
    assert data["provenance"]["command"].startswith("python scripts/bench_memory.py --device cpu")
    assert data["settings"]["chunk_size"] == 4 and data["settings"]["threads"] == 1
    assert bench.results.marked_blocks(readme.read_text()) == {"bench_memory": bench.render(data)}
    assert readme.read_text().endswith("<!-- bench_memory:end -->\nrest\n")
    assert bench.readme_blocks(str(docs)) == {"bench_memory": bench.render(data)}
    assert bench.readme_blocks(str(tmp_path)) == {}
