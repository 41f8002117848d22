"""scripts/bench_eval.py: a small run writes its JSON and the docs table, and the committed table in
docs/evaluation.md equals the rendering of the committed docs/bench_eval.json."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_small_run_writes_json_and_table(tmp_path, load_script):
    bench = load_script("bench_eval")
    page = tmp_path / "evaluation.md"
    page.write_text("# x\n\n<!-- bench_eval:start -->\n<!-- bench_eval:end -->\n")
    argv = ["--rows", "2", "--length", "32", "--batch-sizes", "2", "--docs-dir", str(tmp_path), "--readme",
            str(page), "--write-readme"]  # fmt: skip
    data = bench.main(argv)
    assert [r["setting"] for r in data["rows"]] == list(bench.SETTINGS)
    for row in data["rows"]:
        assert row["new_rows"] == 2 and row["problems_per_second"] == 2 / row["seconds"]
        assert row["steps"] == (32 if row["block"] == 8 else 16)
    assert json.loads((tmp_path / "bench_eval.json").read_text())["rows"] == json.loads(json.dumps(data["rows"]))
    assert bench.readme_blocks(str(tmp_path))["bench_eval"] in page.read_text()


def test_committed_table_equals_its_json(load_script):
    bench = load_script("bench_eval")
    block = bench.readme_blocks(str(ROOT / "docs"))["bench_eval"]
    assert (
        f"<!-- bench_eval:start -->\n{block}<!-- bench_eval:end -->" in (ROOT / "docs" / "evaluation.md").read_text()
    )
