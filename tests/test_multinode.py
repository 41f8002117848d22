"""Two nodes x one process on this machine: torchrun with --nnodes 2 and a static rendezvous on localhost (gloo),
one torchrun per node, as a cluster launcher starts them.

- the StableDRL update equals the one-process whole-batch update (group-exact normalisation across nodes, seeds and
  mask streams by global rank), as tests/test_group_exact.py checks for two processes on one node;
- a run resumed from a checkpoint that the two nodes wrote replays the uninterrupted run exactly;
- the SFT warm-up is trained by both nodes, written once, and read by both; a cache directory the nodes do not
  share (here: a relative path resolved in two different working folders, as node-local disks would) is an error
  on every rank at start-up.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def free_port() -> int:
    """A port the OS reports free (bound to port 0, read, closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two_nodes(env: dict, cwds, worker: str, *worker_args: str, attempts: int = 3) -> str:
    """Run tests/<worker> as 2 nodes x 1 process (node ranks 0 and 1, static rendezvous on 127.0.0.1:<free port>);
    node i runs in cwds[i]. Retries with a new port when the chosen one was taken between choosing and binding.
    Each node's output goes to a file (a pipe left unread while waiting for the other node could fill and block it).
    Fails with both outputs unless both nodes exit 0; returns the outputs."""
    for attempt in range(attempts):
        port = free_port()
        procs, logs = [], []
        for node in (0, 1):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                   "--node-rank", str(node), "--rdzv-backend", "static", "--master-addr", "127.0.0.1",
                   "--master-port", str(port), os.path.join(HERE, worker), *worker_args]  # fmt: skip
            log = open(os.path.join(str(cwds[node]), f".node{node}-attempt{attempt}.log"), "w+")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, env=env, cwd=str(cwds[node]), stdout=log, stderr=subprocess.STDOUT))
        try:
            # a node that fails leaves the other waiting for it in the rendezvous: stop waiting as soon as one fails
            deadline = time.monotonic() + 300
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                if any(p.poll() not in (None, 0) for p in procs):
                    break
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        outs = []
        for log in logs:
            log.seek(0)
            outs.append(log.read())
            log.close()
        text = "\n".join(outs)
        if any(p.returncode for p in procs) and ("EADDRINUSE" in text or "address already in use" in text.lower()):
            continue  # the port was taken by someone else in the meantime: choose another
        assert all(p.returncode == 0 for p in procs), text[-6000:]
        return text
    pytest.fail(f"no free port for the rendezvous after {attempts} attempts")


@pytest.mark.slow
def test_two_nodes_equal_whole_batch(tmp_path, clean_env):
    out = tmp_path / "result.json"
    launch_two_nodes(clean_env, [tmp_path, tmp_path], "group_exact_worker.py", "--out", str(out), "--grad_accum", "1")
    result = json.loads(out.read_text())
    assert result["num_processes"] == 2 and result["num_groups"] == 2
    assert result["max_abs_update"] > 1e-3  # the step did move the parameters
    assert result["max_abs_diff"] < 1e-6, result


def _history(output_dir, checkpoint):
    with open(os.path.join(output_dir, checkpoint, "trainer_state.json")) as f:
        return {h["step"]: h for h in json.load(f)["log_history"] if "loss" in h}


@pytest.mark.slow
def test_two_nodes_resume_replays_exactly(tmp_path, clean_env):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    launch_two_nodes(
        clean_env, [tmp_path, tmp_path], "resume_worker.py", "--output_dir", str(full), "--max_steps", "4"
    )
    # checkpoints are written once, complete, with one RNG state per global rank
    ckpt = full / "checkpoint-2"
    assert {"trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"} <= set(os.listdir(ckpt))
    shutil.copytree(ckpt, resumed / "checkpoint-2")
    launch_two_nodes(clean_env, [tmp_path, tmp_path], "resume_worker.py", "--output_dir", str(resumed),
                     "--max_steps", "4", "--resume_from_checkpoint", str(resumed / "checkpoint-2"))  # fmt: skip
    expected, got = _history(full, "checkpoint-4"), _history(resumed, "checkpoint-4")
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("loss", "reward", "stabledrl/weight_mean", "grad_norm"):
            assert got[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)
    assert expected[3]["loss"] != expected[4]["loss"]  # the compared steps differ from each other


@pytest.mark.slow
def test_two_nodes_share_the_sft_warm_up(tmp_path, clean_env):
    cache = tmp_path / "cache"
    launch_two_nodes(clean_env, [tmp_path, tmp_path], "multinode_worker.py", "--cache_dir", str(cache),
                     "--out", str(tmp_path / "sft-{rank}.json"))  # fmt: skip
    results = [json.loads((tmp_path / f"sft-{r}.json").read_text()) for r in (0, 1)]
    assert results[0]["path"] == results[1]["path"], results
    files = set(results[0]["files"])
    assert {"config.json", "model.safetensors", "sft_settings.json", "tokenizer.json"} <= files, files
    with open(os.path.join(results[0]["path"], "sft_settings.json")) as f:
        assert json.load(f)["settings"]["world_size"] == 2
    assert [p for p in os.listdir(cache) if p.startswith(".")] == []  # no work folder or marker left behind


@pytest.mark.slow
def test_two_nodes_refuse_an_unshared_cache(tmp_path, clean_env):
    # a relative sft_cache_dir resolved in a different folder on each node: two different directories
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for d in nodes:
        d.mkdir()
    launch_two_nodes(clean_env, nodes, "multinode_worker.py", "--cache_dir", "cache",
                     "--out", str(tmp_path / "sft-{rank}.json"))  # fmt: skip
    for r in (0, 1):
        error = json.loads((tmp_path / f"sft-{r}.json").read_text())["error"]
        assert "sft_cache_dir='cache' is not shared by every process: rank 1 on" in error, error
        assert "filesystem every node mounts" in error
    assert not (nodes[1] / "cache").exists() or os.listdir(nodes[1] / "cache") == []  # nothing trained or written


@pytest.mark.slow
def test_two_nodes_refuse_an_unshared_output_dir_unless_saving_on_each_node(tmp_path, clean_env):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for d in nodes:
        d.mkdir()
    launch_two_nodes(clean_env, nodes, "multinode_worker.py", "--cache_dir", "unused", "--trainer_output_dir", "out",
                     "--out", str(tmp_path / "trainer-{rank}.json"))  # fmt: skip
    for r in (0, 1):
        error = json.loads((tmp_path / f"trainer-{r}.json").read_text())["error"]
        assert "output_dir='out' is not shared by every process: rank 1 on" in error, error
        assert "save_on_each_node=True" in error
    # with one checkpoint copy per node, a node-local output_dir is what is asked for
    launch_two_nodes(clean_env, nodes, "multinode_worker.py", "--cache_dir", "unused", "--trainer_output_dir", "out",
                     "--save_on_each_node", "--out", str(tmp_path / "local-{rank}.json"))  # fmt: skip
    assert [json.loads((tmp_path / f"local-{r}.json").read_text()) for r in (0, 1)] == [
        {"rank": 0, "built": True},
        {"rank": 1, "built": True},
    ]


MULTINODE_CONFIGS = ("multinode_fsdp.yaml", "multinode_zero3.yaml")


@pytest.mark.parametrize("name", MULTINODE_CONFIGS)
def test_multinode_accelerate_configs_leave_the_node_to_the_launcher(name):
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    path = os.path.join(ROOT, "configs", "accelerate", name)
    with open(path) as f:
        raw = yaml.safe_load(f)
    assert not {"machine_rank", "main_process_ip", "main_process_port"} & set(raw)  # per node: from the launcher
    config = load_config_from_file(path)
    assert config.num_machines == 2 and config.num_processes == 16 and config.mixed_precision == "bf16"
    if "fsdp" in name:
        assert config.distributed_type.value == "FSDP" and config.fsdp_config["fsdp_version"] == 2
    else:
        assert config.deepspeed_config["zero_stage"] == 3
        assert config.deepspeed_config["deepspeed_multinode_launcher"] == "standard"


def test_slurm_script_starts_one_launch_per_node(tmp_path):
    """The SLURM script under stand-ins for srun (runs its command once per node with SLURM_NODEID set), scontrol
    and accelerate (records its arguments)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "launches.txt"
    bin_dir.mkdir()
    stubs = {
        "scontrol": "#!/usr/bin/env bash\nprintf 'gpu-node-07\\ngpu-node-08\\n'\n",
        "srun": "#!/usr/bin/env bash\n"
        'while [[ "$1" != bash ]]; do shift; done\n'
        'for node in 0 1; do SLURM_NODEID=$node "$@" || exit 1; done\n',
        "accelerate": f'#!/usr/bin/env bash\necho "$@" >> {log}\n',
    }
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-node-[07-08]",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": ROOT}  # fmt: skip
    script = os.path.join(ROOT, "scripts", "launch_multinode.slurm")
    proc = subprocess.run(["bash", script, "--config", "configs/llada_math_full.yaml", "--output_dir", "/shared/run"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        assert line == (
            "launch --config_file configs/accelerate/multinode_fsdp.yaml --num_machines 2 --num_processes 16 "
            f"--machine_rank {rank} --main_process_ip gpu-node-07 --main_process_port 24242 --rdzv_backend static "
            "scripts/train.py --config configs/llada_math_full.yaml --output_dir /shared/run"
        )
    # outside SLURM it says so instead of launching
    bare = {k: v for k, v in env.items() if not k.startswith("SLURM_JOB_NODELIST")}
    proc = subprocess.run(["bash", script], env=bare, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "run under SLURM" in proc.stderr


def test_the_exit_hook_leaves_the_process_group_and_is_registered_once(tmp_path):
    """The hook StableDRLTrainer registers for distributed runs: at exit it destroys an initialised process group
    (after a bounded barrier under gloo), does nothing without one, and registering twice adds one hook."""
    code = f"""
import atexit, torch.distributed as dist
from stabledrl_trl import multinode
calls = []
atexit.register = lambda f: calls.append(f)  # record instead of running at exit
multinode.leave_process_group_at_exit(); multinode.leave_process_group_at_exit()
assert len(calls) == 1, calls
calls[0]()  # no process group: nothing to do
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
assert dist.is_initialized()
calls[0]()
assert not dist.is_initialized()
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
