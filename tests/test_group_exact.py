"""Group-exact self-normalisation: one optimiser step split over gradient-accumulation micro-batches, or over two
processes (accelerate, gloo), gives the parameter update of the single whole-batch computation.

The worker (tests/group_exact_worker.py) trains one SGD step (no gradient clipping, so update = -lr * grad) and
recomputes the loss on all rows of that step at once, with the same per-row masks, from a second copy of the
initial model.
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)


@pytest.mark.parametrize("loss_type", ["stable_drl", "stable_drl_ratio"])
def test_gradient_accumulation_equals_whole_batch(tmp_path, loss_type):
    from group_exact_worker import run

    result = run(str(tmp_path / "result.json"), loss_type=loss_type, grad_accum=2)
    assert result["num_groups"] == 2
    assert result["max_abs_update"] > 1e-3  # the step did move the parameters
    assert result["max_abs_diff"] < 1e-6, result


@pytest.mark.slow
def test_diffusion_gemma_gradient_accumulation_equals_whole_batch(tmp_path):
    """DiffusionGemma (its sampler, the uniform-noise estimator, routed experts): the same group-exact update."""
    from group_exact_worker import run

    result = run(str(tmp_path / "result.json"), grad_accum=2, architecture="diffusion_gemma")
    assert result["num_groups"] == 2 and result["max_abs_update"] > 1e-3
    assert result["max_abs_diff"] < 1e-6, result


def launch_two_processes(tmp_path, env: dict, worker: str, *worker_args: str) -> None:
    """Run tests/<worker> in two gloo processes with torchrun's standalone rendezvous (the OS picks the port, so
    runs never collide) in `env` (the clean_env fixture); fail with the processes' output if either exits non-zero."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(HERE, worker), *worker_args]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_two_processes_equal_whole_batch(tmp_path, clean_env):
    """Two gloo processes. Deterministic on a busy machine: torchrun's standalone rendezvous binds a port the OS
    chooses (a fixed port collides with any other run using it at the same moment), the environment is a clean one,
    and the worker's processes leave the process group together."""
    out = tmp_path / "result.json"
    launch_two_processes(tmp_path, clean_env, "group_exact_worker.py", "--out", str(out), "--grad_accum", "1")
    result = json.loads(out.read_text())
    assert result["num_processes"] == 2 and result["num_groups"] == 2
    assert result["max_abs_update"] > 1e-3
    assert result["max_abs_diff"] < 1e-6, result


@pytest.mark.slow
def test_diffusion_gemma_two_processes_equal_whole_batch(tmp_path, clean_env):
    """DDP on DiffusionGemma: experts that no token of a process chose get no gradient there (DDP searches for unused
    parameters), and the averaged update still equals the whole-batch computation."""
    out = tmp_path / "result.json"
    launch_two_processes(tmp_path, clean_env, "group_exact_worker.py", "--out", str(out), "--grad_accum", "1",
                         "--architecture", "diffusion_gemma")  # fmt: skip
    result = json.loads(out.read_text())
    assert result["num_processes"] == 2 and result["num_groups"] == 2
    assert result["max_abs_update"] > 1e-3
    assert result["max_abs_diff"] < 1e-6, result


@pytest.mark.slow
def test_two_processes_grade_each_row_on_its_own_canvas(tmp_path, clean_env):
    """reward_text="canvas": TRL scores each process's rows locally, so every row meets its own rollout canvas."""
    out = tmp_path / "result.json"
    launch_two_processes(tmp_path, clean_env, "reward_text_worker.py", "--out", str(out))
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert result["num_processes"] == 2 and len(rows) == 8 and {r["rank"] for r in rows} == {0, 1}
    for r in rows:  # the prompt's digit, the EOS (skipped), then the tail its own process wrote
        assert r["cut"] == r["prompt_digit"] and r["text"].startswith(r["prompt_digit"] + f"p{r['rank']}n"), r
    assert len({r["text"] for r in rows if r["rank"] == 0}) == 4  # four distinct canvases per process


@pytest.mark.slow
def test_two_processes_with_dual_cache_and_threshold_rollouts(tmp_path, clean_env):
    # The approximate rollout modes inside the trainer under DDP (two gloo processes): training still runs and the
    # update equals the whole-batch computation on the same rollouts.
    out = tmp_path / "result.json"
    launch_two_processes(
        tmp_path, clean_env, "group_exact_worker.py", "--out", str(out), "--grad_accum", "1",
        "--rollout_cache", "dual", "--parallel_threshold", "0.5",
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["num_processes"] == 2 and result["max_abs_update"] > 1e-3
    assert result["max_abs_diff"] < 1e-6, result
    assert result["rollout_forward_passes"] and all(1 <= f <= 4 for f in result["rollout_forward_passes"])
