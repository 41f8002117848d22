"""The code sandbox's settings, start-up check, verdicts, pool and the unsafe local runner."""

from __future__ import annotations

import os
import stat
import struct
import time

import pytest

from stabledrl_trl import sandbox as sandbox_module
from stabledrl_trl.sandbox import CodeJob, CodeSandbox, SandboxError, SandboxSettings, no_new_process_filter

if os.environ.get("STABLEDRL_SKIP_SANDBOX_TESTS") == "1":
    pytest.skip("STABLEDRL_SKIP_SANDBOX_TESTS=1", allow_module_level=True)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"backend": "docker"}, ["code_sandbox", "docker", "unsafe_local"]),
        ({"timeout": 0}, ["timeout", "0"]),
        ({"timeout": float("nan")}, ["timeout"]),
        ({"grace": -1.0}, ["grace"]),
        ({"memory_mb": 64}, ["memory_mb", "64", "128"]),
        ({"num_workers": 0}, ["num_workers", "0"]),
        ({"max_processes": True}, ["max_processes"]),
        ({"guard": "strict"}, ["guard", "strict"]),
        ({"max_open_files": 8}, ["max_open_files", "16"]),
    ],
)
def test_settings_refuse_bad_values(kwargs, words):
    with pytest.raises(ValueError) as error:
        SandboxSettings(**kwargs)
    for word in words:
        assert word in str(error.value)


def test_settings_defaults():
    s = SandboxSettings()
    assert (s.backend, s.timeout, s.guard, s.max_processes) == ("bwrap", 3.0, "official", 1)
    assert s.cpu_limit == 4 and s.workers == (os.cpu_count() or 1)
    assert SandboxSettings(timeout=0.5).cpu_limit == 2


def test_seccomp_filter_layout():
    program = no_new_process_filter("x86_64")
    assert len(program) % 8 == 0
    ops = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    # Load arch, compare with AUDIT_ARCH_X86_64; every jump stays inside the program; three returns at the end.
    assert ops[0] == (0x20, 0, 0, 4) and ops[1][3] == 0xC000003E
    for index, (op, jt, jf, _) in enumerate(ops):
        if op & 0x07 == 0x05:
            assert index + 1 + max(jt, jf) < len(ops)
    assert [op[0] for op in ops[-3:]] == [0x06] * 3
    assert [op[3] for op in ops[-3:]] == [0x7FFF0000, 0x00050001, 0x00050026]
    assert {op[3] for op in ops if op[0] == 0x15} >= {57, 58, 56, 435}
    assert no_new_process_filter("riscv64") is None
    assert {op[3] for op in map(lambda i: struct.unpack("=HBBI", no_new_process_filter("aarch64")[i : i + 8]),
                                range(0, len(no_new_process_filter("aarch64")), 8)) if op[0] == 0x15} >= {220, 435}  # fmt: skip


def _fake_bwrap(tmp_path, message):
    path = tmp_path / "bwrap"
    path.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_start_up_check_says_why_and_what_to_do(tmp_path, monkeypatch):
    fake = _fake_bwrap(tmp_path, "bwrap: No permissions to create a new namespace")
    monkeypatch.setattr(sandbox_module, "bwrap_binary", lambda: fake)
    with pytest.raises(SandboxError) as error:
        CodeSandbox(SandboxSettings())
    text = str(error.value)
    assert "No permissions to create a new namespace" in text
    assert "user namespaces" in text and "unsafe_local" in text


def test_no_bwrap_binary(monkeypatch):
    monkeypatch.setattr(sandbox_module, "bwrap_binary", lambda: None)
    with pytest.raises(SandboxError, match="no bwrap binary"):
        CodeSandbox(SandboxSettings())


@pytest.mark.parametrize("mode", ["zygote", "per_program"])
def test_sandbox_failing_mid_run_raises_not_scores(tmp_path, mode):
    box = CodeSandbox(SandboxSettings(timeout=1.0, num_workers=2, mode=mode))
    assert box.run(CodeJob(program="x = 1", checks=("assert x == 1",))).passed
    box._bwrap = _fake_bwrap(tmp_path, "bwrap: Creating new namespace failed")
    for zygote in list(box._zygotes):
        zygote.process.kill()  # the running sandboxes end too: the job is judged again in a new one, which fails
    with pytest.raises(SandboxError, match="Creating new namespace failed"):
        box.run_many([CodeJob(program="x = 1", checks=("assert x == 1",))])
    with pytest.raises(SandboxError, match="Creating new namespace failed"):  # no zygote left: a new one fails
        box.run_many([CodeJob(program="x = 1", checks=("assert x == 1",))])
    box.close()


@pytest.mark.parametrize("mode", ["zygote", "per_program"])
def test_harness_that_cannot_start_is_a_sandbox_error(monkeypatch, mode):
    box = CodeSandbox(SandboxSettings(mode=mode), check=False)
    monkeypatch.setattr(sandbox_module, "SANDBOX_HARNESS", "/sandbox/missing_harness.py")
    with pytest.raises(SandboxError, match="before the harness started|did not start") as error:
        box.run(CodeJob(program="x = 1", checks=("assert x == 1",)))
    assert "missing_harness.py" in str(error.value)  # the interpreter's own message is passed on


def test_fraction_of_checks_and_stop_at_first_failure():
    box = CodeSandbox(SandboxSettings(timeout=2.0, num_workers=2))
    program = "def sq(x):\n    return x * x if x < 3 else -1\n"
    checks = tuple(f"assert sq({i}) == {i * i}" for i in range(5))
    every = box.run(CodeJob(program=program, checks=checks, stop_at_first_failure=False))
    assert (every.status, every.num_passed, every.num_checks, every.fraction) == ("failed", 3, 5, 0.6)
    first = box.run(CodeJob(program=program, checks=checks[::-1]))
    assert (first.status, first.num_passed) == ("failed", 0)
    tests = "def test_a():\n    assert sq(1) == 1\n\ndef test_b():\n    assert sq(4) == 16\n\nhelper = 3\n"
    mixed = box.run(CodeJob(program=program, tests=tests, checks=("assert helper == 3",),
                            test_functions=("test_a", "test_b"), stop_at_first_failure=False))  # fmt: skip
    assert (mixed.num_passed, mixed.num_checks) == (2, 3)
    box.close()


def test_pool_runs_programs_in_parallel():
    box = CodeSandbox(SandboxSettings(timeout=5.0, num_workers=4))
    jobs = [CodeJob(program="import time\ntime.sleep(1.5)\n", checks=("assert True",))] * 4
    start = time.monotonic()
    results = box.run_many(jobs)
    elapsed = time.monotonic() - start
    assert all(r.passed for r in results)
    assert elapsed < 4.5  # one after another: at least 6 s
    box.close()


def test_unsafe_local_warns_and_keeps_limits(tmp_path):
    with pytest.warns(UserWarning, match="WITHOUT isolation"):
        box = CodeSandbox(SandboxSettings(backend="unsafe_local", timeout=1.0, grace=0.5, guard="none"))
    assert box.run(CodeJob(program="x = 1", checks=("assert x == 1",))).passed
    assert box.run(CodeJob(program="x = bytearray(8 * 1024 ** 3)")).status == "program_error"
    assert box.run(CodeJob(program="import os\nos.fork()\n")).status == "program_error"
    assert box.run(CodeJob(program="while True:\n    pass\n")).status == "timeout"
    env = box.run(CodeJob(program="import os\nv = dict(os.environ)\n", checks=("assert 'HF_TOKEN' not in v",)))
    assert env.passed
    box.close()


def test_a_python_installation_holding_home_is_refused(monkeypatch):
    monkeypatch.setattr(sandbox_module, "_python_roots", lambda: [os.path.dirname(os.path.expanduser("~"))])
    with pytest.raises(SandboxError, match="would expose the whole file system or your home directory"):
        CodeSandbox(SandboxSettings())
