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


TINY = ["--device", "cpu", "--gen-length", "8", "--prompt-length", "5", "--batch-size", "2", "--hidden-size", "32",
        "--layers", "2", "--vocab-size", "64", "--threads", "1"]  # fmt: skip


def test_write_readme_renders_each_model_from_its_json(load_script, tmp_path, monkeypatch):
    import json

    bench = load_script("bench_block_rollout")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n<!-- bench_block_rollout_sdar:start -->\nold\n<!-- bench_block_rollout_sdar:end -->\n"
        "<!-- bench_block_rollout_llada2:start -->\nold\n<!-- bench_block_rollout_llada2:end -->\n"
    )
    monkeypatch.setattr(bench.results, "README", str(readme))
    docs = tmp_path / "docs"
    for model in ("sdar", "llada2"):
        assert bench.main([*TINY, "--model", model, "--docs-dir", str(docs), "--write-readme"]) == 0
    blocks = bench.results.marked_blocks(readme.read_text())
    assert blocks == bench.readme_blocks(str(docs)) and set(blocks) == {
        "bench_block_rollout_sdar", "bench_block_rollout_llada2"
    }  # fmt: skip
    for model in ("sdar", "llada2"):
        data = json.loads((docs / f"bench_block_rollout_{model}.json").read_text())
        assert data["prompt_lengths"] == [5, 4] and data["settings"]["model"] == model
        assert data["model_shape"]["hidden_size"] == 32 and data["model_shape"]["num_hidden_layers"] == 2
        full, cached = data["rows"]
        block = blocks[f"bench_block_rollout_{model}"]
        assert f"The KV cache is {cached['speedup']:.2f}x as fast as recomputing the prefix" in block
        assert f"runs {cached['forwards'] - full['forwards']} more forwards" in block
        assert "ragged prompts of 4-5 tokens" in block and data["provenance"]["command"] in block
    assert "8 experts of width 16, 2 per token, 1 shared" in blocks["bench_block_rollout_llada2"]


def test_render_by_hand(load_script):
    bench = load_script("bench_block_rollout")
    rows = [
        {"mode": "recompute prefix", "seconds": 8.0, "tokens": 64, "tokens_per_s": 8.0, "forwards": 10,
         "speedup": 1.0, "identical": True},
        {"mode": "KV cache", "seconds": 2.0, "tokens": 64, "tokens_per_s": 32.0, "forwards": 13, "speedup": 4.0,
         "identical": True},
    ]  # fmt: skip
    data = {
        "provenance": {"commit": "abcdef0123456", "dirty": True, "command": "python scripts/bench_block_rollout.py",
                       "versions": {"python": "3", "torch": "2", "transformers": "5", "trl": "1"}},
        "settings": {"model": "sdar", "dtype": "float32", "batch_size": 2, "steps": None, "remasking": "static",
                     "temperature": 0.0, "gen_length": 16, "device": "cpu", "threads": 2},
        "model_shape": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "vocab_size": 64, "block_size": 4},
        "prompt_lengths": [7, 6],
        "rows": rows,
    }  # fmt: skip
    text = bench.render(data)
    assert text.startswith("SDAR-architecture model (hidden 32, 2 layers, GQA 4/2, vocab 64), random weights")
    assert "batch 2 ragged prompts of 6-7 tokens, block 4, 4 steps per block (static), temperature 0," in text
    assert "| KV cache | 2.00 | 32.0 | 4.00 | 13 | yes |" in text and "cpu, 2 threads" in text
    assert "The KV cache is 4.00x as fast as recomputing the prefix, with identical tokens; it runs 3 more" in text
    assert "at commit abcdef0123 (uncommitted changes);" in text
