"""scripts/gpu_check.sh --tiny: every part of the GPU check runs at tiny shapes on the CPU and lands in one JSON
summary with its checks (the GPU run itself needs a CUDA machine)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_gpu_check_tiny_writes_one_summary(tmp_path, clean_env):
    # the interpreter running the tests, not whichever `python` PATH finds (none, without an activated venv)
    env = dict(clean_env, GPU_CHECK_OUT=str(tmp_path), PYTHON=sys.executable)
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--tiny"], env=env,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode"] == "tiny" and summary["device"] == "cpu"
    assert set(summary["parts"]) == {"rollout_standard", "rollout_early_eos", "cache_exactness", "lora_step"}
    assert all(p["status"] == "ok" for p in summary["parts"].values()), summary["parts"]
    assert summary["checks"] and all(summary["checks"].values()), summary["checks"]
    rows = summary["rollout_throughput"]
    modes = {(r["case"], r["mode"]) for r in rows}
    assert {
        ("standard", "literal"),
        ("standard", "exact"),
        ("standard", "dual cache"),
        ("early EOS", "exact"),
    } <= modes
    assert all(r["tokens_per_s"] > 0 and r["forward_passes"] >= 1 for r in rows)
    exact = {r["dtype"]: r for r in summary["cache_exactness"]["rows"]}
    assert exact["float32"]["identical"] and exact["float32"]["match"] == 1.0 and exact["float32"]["tokens"] > 0
    step = summary["lora_step"]
    assert step["lora"] and step["attention"] == "sdpa" and len(step["loss"]) == step["steps"] == 1
    assert sum(step["shares"].values()) == pytest.approx(1.0)
    assert step["seconds_per_step"]["rollout"] > 0 and step["seconds_per_step"]["backward"] > 0
