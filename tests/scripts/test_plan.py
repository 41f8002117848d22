"""scripts/plan.py: every GPU config carries the planner's current estimate; the command line plans, advises and
rewrites its comment block in place."""

import glob
import os
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_CONFIGS = sorted(
    p
    for pattern in ("llada_*.yaml", "llada2_*.yaml", "sdar_*.yaml")
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
    with pytest.raises(ValueError, match="no model_name_or_path"):
        plan.main(["--config", str(tmp_path / "none.yaml")])


def test_validation_table_is_the_scripts_output_and_within_20_percent(load_script):
    """docs/plan_validation.{json,md} come from scripts/bench_plan.py; the README shows that markdown unchanged, and
    every case (full and LoRA, several shapes) is within 20% of its measured peak."""
    import json

    bench = load_script("bench_plan")
    with open(os.path.join(ROOT, "docs", "plan_validation.json")) as f:
        rows = json.load(f)
    assert {r["case"] for r in rows} == set(bench.CASES)
    assert any("LoRA" in r["case"] for r in rows) and any("full" in r["case"] for r in rows)
    for r in rows:
        shape, settings = bench.case_settings(bench.CASES[r["case"]], r["overhead_mib"] * 2**20)
        from stabledrl_trl.memory_plan import estimate

        assert estimate(shape, settings)["peak"] / 2**20 == pytest.approx(r["estimate_mib"])  # the current planner
        assert abs(r["estimate_mib"] / r["measured_mib"] - 1) < 0.20, r
    table = open(os.path.join(ROOT, "docs", "plan_validation.md")).read().strip()
    assert table == bench.format_markdown(rows)
    assert table in open(os.path.join(ROOT, "README.md")).read()
