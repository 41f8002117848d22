"""The code sandbox's verdict cache: keys, what is stored, eviction, and CodeSandbox using it."""

from __future__ import annotations

import dataclasses
import os

import pytest

from stabledrl_trl.sandbox import CodeJob, CodeResult, CodeSandbox, SandboxSettings
from stabledrl_trl.verdict_cache import TIME_FRACTION, VerdictCache, cacheable, job_key

JOB = CodeJob(program="def f(x):\n    return x + 1", checks=("assert f(1) == 2",))


def _result(status="passed", seconds=0.01, output="", detail=""):
    return CodeResult(status=status, num_passed=1 if status == "passed" else 0, num_checks=1, seconds=seconds,
                      output=output, detail=detail)  # fmt: skip


def test_key_separates_everything_that_decides_a_verdict():
    base = SandboxSettings(timeout=1.0)
    key = job_key(JOB, base)
    assert key == job_key(CodeJob(program=JOB.program, checks=("assert f(1) == 2",)), base)  # equal jobs, equal keys
    other_jobs = [
        dataclasses.replace(JOB, program="def f(x):\n    return x + 2"),
        dataclasses.replace(JOB, checks=("assert f(1) == 3",)),
        dataclasses.replace(JOB, tests="def test_a():\n    assert f(1) == 2"),
        dataclasses.replace(JOB, tests="def test_a():\n    assert f(1) == 2", test_functions=("test_a",)),
        dataclasses.replace(JOB, stop_at_first_failure=False),
        # the split between program and tests matters (the program is compiled on its own)
        dataclasses.replace(JOB, program="def f(x):\n    return x + 1\n", tests=""),
    ]
    other_settings = [
        SandboxSettings(timeout=2.0), SandboxSettings(timeout=1.0, memory_mb=512),
        SandboxSettings(timeout=1.0, guard="none"), SandboxSettings(timeout=1.0, cpu_seconds=9),
        SandboxSettings(timeout=1.0, max_processes=4), SandboxSettings(timeout=1.0, max_output_bytes=100),
        SandboxSettings(timeout=1.0, mode="per_program"), SandboxSettings(timeout=1.0, grace=2.0),
        SandboxSettings(timeout=1.0, max_file_mb=1), SandboxSettings(timeout=1.0, max_open_files=32),
        SandboxSettings(timeout=1.0, tmp_size_mb=8), SandboxSettings(timeout=1.0, backend="unsafe_local"),
    ]  # fmt: skip
    keys = {job_key(job, base) for job in other_jobs} | {job_key(JOB, s) for s in other_settings}
    assert key not in keys and len(keys) == len(other_jobs) + len(other_settings)
    # How many run at once and the cache's own size do not change a verdict.
    assert job_key(JOB, SandboxSettings(timeout=1.0, num_workers=7, verdict_cache_mb=3)) == key


def test_only_verdicts_reached_well_inside_the_limit_are_stored():
    for status in ("passed", "failed", "program_error", "tests_error"):
        assert cacheable(_result(status), timeout=1.0)
    for status in ("timeout", "crashed"):
        assert not cacheable(_result(status), timeout=1.0)
    assert cacheable(_result(seconds=TIME_FRACTION * 2.0), timeout=2.0)
    assert not cacheable(_result(seconds=TIME_FRACTION * 2.0 + 0.01), timeout=2.0)
    cache = VerdictCache(10_000, timeout=1.0)
    assert cache.put(b"t", _result("timeout")) is False and cache.get(b"t") is None
    assert cache.put(b"p", _result("failed")) is True
    hit = cache.get(b"p")
    assert hit.cached and (hit.status, hit.num_passed, hit.seconds) == ("failed", 0, 0.01)
    assert (cache.hits, cache.misses, cache.stored) == (1, 1, 1)


def test_least_recently_used_entries_leave_first_within_the_byte_bound():
    cache = VerdictCache(3 * (256 + 100), timeout=1.0)  # room for three entries of 100 output characters
    for name in (b"a", b"b", b"c"):
        cache.put(name, _result(output="x" * 100))
    assert cache.get(b"a") is not None  # a is now the most recently used
    cache.put(b"d", _result(output="x" * 100))
    assert cache.get(b"b") is None and all(cache.get(k) is not None for k in (b"a", b"c", b"d"))
    assert len(cache) == 3 and cache.bytes == 3 * 356
    assert cache.put(b"big", _result(output="x" * 2000)) is False  # larger than the whole cache: not stored
    with pytest.raises(ValueError, match="max_bytes"):
        VerdictCache(0, timeout=1.0)


@pytest.mark.parametrize("value", [-1, True, 1.5, "8"])
def test_setting_refuses_bad_values(value):
    with pytest.raises(ValueError, match="verdict_cache_mb: expected an integer >= 0"):
        SandboxSettings(verdict_cache_mb=value)
    assert SandboxSettings().verdict_cache_mb == 0  # a plain CodeSandbox runs every job it is given


# --- in the sandbox ------------------------------------------------------------------------------------------------

needs_sandbox = pytest.mark.skipif(os.environ.get("STABLEDRL_SKIP_SANDBOX_TESTS") == "1", reason="no sandbox")


@pytest.fixture(scope="module")
def box():
    with CodeSandbox(SandboxSettings(timeout=1.0, num_workers=2, verdict_cache_mb=1)) as sandbox:
        yield sandbox


def _counting(box, monkeypatch):
    runs = []
    original = box._run
    monkeypatch.setattr(box, "_run", lambda job: runs.append(job.program) or original(job))
    return runs


@needs_sandbox
def test_a_hit_gives_the_verdict_of_the_run_without_running(box, monkeypatch):
    runs = _counting(box, monkeypatch)
    right = CodeJob(program="def g(x):\n    return 2 * x", checks=("assert g(2) == 4", "assert g(3) == 6"))
    wrong = dataclasses.replace(right, program="def g(x):\n    return x + 2")
    crash = dataclasses.replace(right, program="raise ValueError('no')")
    first = box.run_many([right, wrong, crash, right])  # the copy of `right` runs once
    assert [r.status for r in first] == ["passed", "failed", "program_error", "passed"]
    assert [r.cached for r in first] == [False, False, False, True] and len(runs) == 3
    again = box.run_many([crash, right, wrong])
    assert len(runs) == 3 and all(r.cached for r in again)
    for new, old in zip(again, (first[2], first[0], first[1])):
        assert (new.status, new.num_passed, new.num_checks, new.detail) == (old.status, old.num_passed,
                                                                            old.num_checks, old.detail)  # fmt: skip
    assert box.run(right).cached and len(runs) == 3


@needs_sandbox
def test_the_same_program_under_other_tests_is_run_and_judged_by_them(box, monkeypatch):
    runs = _counting(box, monkeypatch)
    program = "def h(x):\n    return x * 3"
    jobs = [CodeJob(program=program, checks=(f"assert h(2) == {v}",)) for v in (6, 7)]
    jobs.append(CodeJob(program=program, tests="def test_h():\n    assert h(1) == 3", test_functions=("test_h",)))
    assert [r.passed for r in box.run_many(jobs)] == [True, False, True] and len(runs) == 3
    assert [r.passed for r in box.run_many(jobs[::-1])] == [True, False, True][::-1] and len(runs) == 3


@needs_sandbox
def test_timeouts_crashes_and_slow_passes_are_run_every_time(box, monkeypatch):
    runs = _counting(box, monkeypatch)
    loop = CodeJob(program="while True:\n    pass", checks=("assert True",))
    exits = CodeJob(program="import os\nos._exit(0)", checks=("assert True",))
    slow = CodeJob(program="import time\ntime.sleep(0.6)", checks=("assert True",))  # past half the limit
    for _ in range(2):
        verdicts = box.run_many([loop, exits, slow])
        assert [r.status for r in verdicts[:2]] == ["timeout", "crashed"]
        assert verdicts[2].seconds > TIME_FRACTION * box.settings.timeout  # whatever its status under load
        assert not any(r.cached for r in verdicts)
    assert len(runs) == 6


@needs_sandbox
def test_limits_change_the_verdict_and_the_key():
    """A program that needs 300 MiB passes under 1024 MiB and fails under 200: two sandboxes, two verdicts, and the
    keys differ (no sharing of a cache could give one the other's verdict)."""
    job = CodeJob(program="data = bytearray(300 * 1024 * 1024)", checks=("assert len(data) > 0",))
    big, small = (SandboxSettings(timeout=2.0, num_workers=1, memory_mb=m, verdict_cache_mb=1) for m in (1024, 200))
    with CodeSandbox(big) as a, CodeSandbox(small) as b:
        assert [a.run(job).passed, b.run(job).passed] == [True, False]
        assert [a.run(job).cached, b.run(job).cached] == [True, True]
        assert [a.run(job).passed, b.run(job).passed] == [True, False]
    assert job_key(job, big) != job_key(job, small)
