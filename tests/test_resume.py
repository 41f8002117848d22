"""Exact resume: a run killed with SIGKILL and resumed from its last checkpoint logs the same losses and rewards from
then on as an uninterrupted run (rollout noise and mask seeds derive from the seed and the optimiser step, so
nothing depends on process state that a checkpoint would lose)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "resume_worker.py")
KEYS = ("loss", "reward", "stabledrl/weight_mean", "stabledrl/log_ratio_std", "grad_norm")


def history(output_dir, checkpoint):
    with open(os.path.join(output_dir, checkpoint, "trainer_state.json")) as f:
        return {h["step"]: h for h in json.load(f)["log_history"] if "loss" in h}


def run(args, env, timeout=600):
    proc = subprocess.run([sys.executable, WORKER, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    run(["--output_dir", full], env)

    proc = subprocess.Popen(
        [sys.executable, WORKER, "--output_dir", killed, "--sleep", "30"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.time() + 600
    for line in proc.stdout:  # wait until checkpoint-3 is written, then kill mid-run
        if line.startswith("SAVED 3") or time.time() > deadline:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert os.path.isdir(os.path.join(killed, "checkpoint-3")) and not os.path.exists(
        os.path.join(killed, "checkpoint-6")
    )

    run(["--output_dir", killed, "--resume_from_checkpoint", os.path.join(killed, "checkpoint-3")], env)
    expected, resumed = history(full, "checkpoint-6"), history(killed, "checkpoint-6")
    assert sorted(resumed) == sorted(expected) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        for key in KEYS:
            assert resumed[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)
