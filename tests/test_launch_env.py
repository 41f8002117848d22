"""Launch variables that cannot be right are refused when the config is built (no hang, no bare int() traceback), and
`output_dir` gets `~` and `$VAR` expanded as a shell would."""

import os
import subprocess
import sys

import pytest

from stabledrl_trl.launch_env import LaunchEnvironmentError, check_launch_environment, expand_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "env, words",
    [
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set but no launcher started this process"),
        ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "never come"),
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not an integer"),
        ({"RANK": "x1"}, "RANK='x1' is not an integer"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 is out of range"),
        ({"RANK": "3"}, "RANK=3 is not below WORLD_SIZE=1 (unset: 1)"),
        ({"WORLD_SIZE": "2", "RANK": "5", "TORCHELASTIC_RUN_ID": "x"}, "RANK=5 is not below WORLD_SIZE=2"),
        ({"LOCAL_RANK": "1"}, "LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1"),
    ],
)
def test_launch_variables_that_cannot_be_right_are_refused(env, words):
    with pytest.raises(LaunchEnvironmentError, match=None) as info:
        check_launch_environment(env)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"},
        {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc"},
        {"WORLD_SIZE": "2", "RANK": "1", "CROSS_SIZE": "1"},  # DeepSpeed's launcher
        {"WORLD_SIZE": "2", "RANK": "1", "STABLEDRL_LAUNCHED": "1"},
    ],
)
def test_launched_or_single_processes_pass(env):
    check_launch_environment(env)


def test_one_plain_process_with_a_world_size_of_two_stops_at_once(tmp_path):
    """The hostile case: rank 0 of a world of 2 started alone (it used to wait for its peer for 30 minutes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "ACCELERATE_"))}
    env.update(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1", PYTHONPATH=ROOT)
    code = (
        "from stabledrl_trl import StableDRLConfig\n"
        f"StableDRLConfig(output_dir={str(tmp_path / 'out')!r}, use_cpu=True, bf16=False, report_to='none',"
        " per_device_train_batch_size=4, num_generations=4)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "LaunchEnvironmentError: WORLD_SIZE=2 is set but no launcher started this process" in proc.stderr


def test_output_dir_expands_home_and_variables(tmp_path, monkeypatch):
    from stabledrl_trl import StableDRLConfig

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RUNS", str(tmp_path / "runs"))
    kw = dict(use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4, num_generations=4)
    assert StableDRLConfig(output_dir="$HOME/runs/a", **kw).output_dir == str(tmp_path / "home" / "runs" / "a")
    assert StableDRLConfig(output_dir="~/b", **kw).output_dir == str(tmp_path / "home" / "b")
    assert StableDRLConfig(output_dir="${RUNS}/c", **kw).output_dir == str(tmp_path / "runs" / "c")
    with pytest.raises(
        ValueError, match=r"output_dir='\$NOT_SET_ANYWHERE/x' uses the environment variable 'NOT_SET_ANYWHERE'"
    ):
        StableDRLConfig(output_dir="$NOT_SET_ANYWHERE/x", **kw)
    assert expand_path("output_dir", "plain/path") == "plain/path"
    assert not (tmp_path / "$HOME").exists()
