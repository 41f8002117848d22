"""scripts/plan.py: every GPU config carries the planner's current estimate; the command line plans, advises and
rewrites its comment block in place."""

import glob
import os
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_CONFIGS = sorted(
    p
    for pattern in ("llada_*.yaml", "llada2_*.yaml", "sdar_*.yaml", "diffusion_gemma_*.yaml")
    for p in glob.glob(os.path.join(ROOT, "configs", pattern))
)


def test_there_are_gpu_configs():
    names = {os.path.basename(p) for p in GPU_CONFIGS}
    assert {"llada_gsm8k_lora.yaml", "llada_math_full.yaml", "sdar_math_lora.yaml"} <= names


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=os.path.basename)
def test_gpu_config_carries_the_current_estimate(path, load_script, monkeypatch):
    from stabledrl_trl.memory_plan import COMMENT_BEGIN, COMMENT_END, comment_block

    plan = load_script("plan")
    lines = open(path).read().splitlines()
    assert lines.count(COMMENT_BEGIN) == 1 and lines.count(COMMENT_END) == 1, (
        f"{path}: run scripts/plan.py --write-comment"
    )
    block = lines[lines.index(COMMENT_BEGIN) : lines.index(COMMENT_END) + 1]
    command = block[1].removeprefix("# ")
    assert command.startswith("python scripts/plan.py ") and command.endswith(" --write-comment")
    argv = shlex.split(command)[2:-1]
    assert argv[argv.index("--config") + 1] == os.path.relpath(path, ROOT)
    monkeypatch.chdir(ROOT)
    text, components = plan.plan(plan.make_parser().parse_args(argv))
    assert block == comment_block(text), f"{path}: the estimate is stale; rerun: {command}"
    assert "fits in" in text and components["peak"] > components["weights"] > 0


def test_plan_command_line_writes_its_comment_once(tmp_path, load_script, capsys):
    plan = load_script("plan")
    config = tmp_path / "run.yaml"
    config.write_text(
        "model_name_or_path: GSAI-ML/LLaDA-8B-Instruct\ndtype: bfloat16\ngradient_checkpointing: false\n"
    )
    argv = ["--config", str(config), "--gpus", "1", "--gpu-memory", "80", "--json", str(tmp_path / "plan.json")]
    components = plan.main([*argv, "--write-comment"])
    out = capsys.readouterr().out
    assert "does NOT fit in 80 GiB" in out and "change: shard the model" in out  # full 8B with Adam on one GPU
    first = config.read_text()
    plan.main([*argv, "--write-comment"])
    assert config.read_text() == first  # replaced, not appended
    assert first.startswith("model_name_or_path: GSAI-ML/LLaDA-8B-Instruct\n") and first.count("# ---") == 2
    import json

    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["peak"] == components["peak"] > 80 * 2**30
    # a local model folder instead of a hub id, and a clear error without any
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(open(os.path.join(ROOT, "tests", "fixtures", "llada-tiny",
                                                                  "config.json")).read())  # fmt: skip
    small = plan.main(["--config", str(config), "--model", str(tmp_path / "m")])
    assert small["peak"] < 2 * 2**30
    (tmp_path / "none.yaml").write_text("dtype: bfloat16\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        plan.main(["--config", str(tmp_path / "none.yaml")])
    assert exit_info.value.code == 2 and "no model_name_or_path" in capsys.readouterr().err


def test_validation_json_is_the_current_planner_on_the_current_cases_and_within_20_percent(load_script):
    """docs/bench_plan.json comes from scripts/bench_plan.py with the script's current cases, its estimates are the
    current planner's, and every case (full and LoRA, several shapes) is within 20% of its measured peak. That the
    README's table is this file's rendering is checked by tests/test_readme_results.py."""
    from stabledrl_trl import results
    from stabledrl_trl.memory_plan import estimate

    bench = load_script("bench_plan")
    data = results.read_json(os.path.join(ROOT, "docs", "bench_plan.json"))
    assert data["provenance"]["command"].startswith("python scripts/bench_plan.py")
    assert data["settings"]["cases"] == bench.CASES and data["baseline"] == bench.BASELINE
    rows = data["rows"]
    assert [r["case"] for r in rows] == list(bench.CASES)
    assert any("LoRA" in r["case"] for r in rows) and any("full" in r["case"] for r in rows)
    assert data["overhead_mib"] > 0
    for r in rows:
        shape, settings = bench.case_settings(bench.CASES[r["case"]], data["overhead_mib"] * 2**20)
        plan = estimate(shape, settings)
        assert plan["peak"] / 2**20 == pytest.approx(r["estimate_mib"]), r["case"]  # rerun the script if this fails
        assert plan["phase"] == r["phase"] and shape.num_parameters() == r["parameters"]
        assert r["error"] == pytest.approx(r["estimate_mib"] / r["measured_mib"] - 1)
        assert abs(r["error"]) < 0.20, r


def _made_up_validation() -> dict:
    rows = [
        {"case": "full a", "parameters": 21_238_272, "measured_mib": 500.0, "estimate_mib": 450.0, "error": -0.1,
         "phase": "training"},
        {"case": "LoRA b", "parameters": 1_500_000, "measured_mib": 200.0, "estimate_mib": 205.0, "error": 0.025,
         "phase": "rollout"},
        {"case": "full c", "parameters": 48_760_000, "measured_mib": 100.4, "estimate_mib": 105.42, "error": 0.05,
         "phase": "training"},
    ]  # fmt: skip
    provenance = {"commit": "0123456789abcdef", "dirty": False, "command": "python scripts/bench_plan.py --write-readme",
                  "versions": {"python": "3", "torch": "2", "transformers": "5", "trl": "1"}}  # fmt: skip
    baseline = {"d": 64, "layers": 1, "vocab": 256}
    return {"provenance": provenance, "settings": {}, "baseline": baseline, "overhead_mib": 38.5859375, "rows": rows}


def test_validation_block_rendered_by_hand(load_script):
    bench = load_script("bench_plan")
    text = bench.render(_made_up_validation())
    assert text.startswith(
        "Runtime overhead, measured with a tiny model (d_model 64, 1 layer, vocabulary 256) and given to the planner: "
        "38.6 MiB. Error = estimate / measured - 1.\n\n"
        "| case | parameters | measured peak (MiB) | estimate (MiB) | error | peak phase (estimate) |\n"
        "|---|---|---|---|---|---|\n"
    )
    assert "| full a | 21.2M | 500 | 450 | -10.0% | training |\n" in text
    assert "| LoRA b | 1.5M | 200 | 205 | +2.5% | rollout |\n" in text
    assert "| full c | 48.8M | 100 | 105 | +5.0% | training |\n\n" in text
    assert (
        "Over the 3 cases the error runs from -10.0% (full a) to +5.0% (full c); the largest |error| is 10.0%.\n"
        in text
    )
    assert text.endswith(
        "Generated by `python scripts/bench_plan.py --write-readme` at commit 0123456789; Python 3, torch 2, "
        "transformers 5, trl 1.\n"
    )


def test_validation_readme_only_and_bad_cases(load_script, tmp_path, monkeypatch, capsys):
    from stabledrl_trl import results

    bench = load_script("bench_plan")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- bench_plan:start -->\nold -1.0%\n<!-- bench_plan:end -->\nrest\n")
    monkeypatch.setattr(bench.results, "README", str(readme))
    docs = tmp_path / "docs"
    with pytest.raises(SystemExit, match="no bench_plan.json"):
        bench.main(["--readme-only", "--docs-dir", str(docs)])
    assert bench.readme_blocks(str(docs)) == {}
    data = _made_up_validation()
    results.write_json(str(docs / "bench_plan.json"), data)
    bench.main(["--readme-only", "--docs-dir", str(docs)])
    assert results.marked_blocks(readme.read_text()) == {"bench_plan": bench.render(data)}
    assert readme.read_text().endswith("<!-- bench_plan:end -->\nrest\n")
    for argv, words in ((["--cases", "full d512x4,nope"], "--cases: unknown ['nope']"), (["--cases", " , "], "--cases: no case")):
        with pytest.raises(SystemExit) as exit_info:  # a usage error, before any measurement
            bench.main(argv)
        assert exit_info.value.code == 2 and words in capsys.readouterr().err
