"""The zygote mode of the code sandbox: a program must not change the next program's verdict or environment.

One worker, so every program of a test runs in the same zygote (unless the zygote is restarted, which
`CodeSandbox.restarts` counts). After each hostile program, an honest right and an honest wrong program must be
judged right, and a probe must find a clean environment. Needs bubblewrap, like tests/test_sandbox_hostile.py.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time

import pytest

from stabledrl_trl import sandbox as sandbox_module
from stabledrl_trl.sandbox import CodeJob, CodeSandbox, SandboxSettings, child_filter

if os.environ.get("STABLEDRL_SKIP_SANDBOX_TESTS") == "1":
    pytest.skip("STABLEDRL_SKIP_SANDBOX_TESTS=1", allow_module_level=True)

RIGHT = CodeJob(program="def add(a, b):\n    return a + b\n", checks=("assert add(2, 3) == 5",))
WRONG = CodeJob(program="def add(a, b):\n    return a - b\n", checks=("assert add(2, 3) == 5",))
# What a fresh program sees: empty scratch directories, one thread, unpatched modules and builtins, no leftovers.
PROBE = CodeJob(
    program=(
        "import os, sys, json, builtins, threading\n"
        "state = (sorted(os.listdir('/tmp')), sorted(os.listdir('/dev/shm')), threading.active_count(),\n"
        "         json.dumps([1]), len([1, 2]), [k for k in vars(builtins) if k.startswith('pwn')],\n"
        "         'pwned' in globals(), os.getcwd(), os.access('/tmp', os.W_OK), os.getppid(),\n"
        "         os.path.islink('/dev/stdin') and os.readlink('/dev/stdin'))\n"
    ),
    checks=("assert state == ([], [], 1, '[1]', 2, [], False, '/tmp', True, 1, '/proc/self/fd/0'), state",),
)


@pytest.fixture()
def box():
    with CodeSandbox(SandboxSettings(timeout=1.0, grace=0.5, num_workers=1, guard="none")) as sandbox:
        assert sandbox.settings.run_mode == "zygote"
        yield sandbox


def assert_next_programs_judged_right(box):
    right, wrong, probe = box.run(RIGHT), box.run(WRONG), box.run(PROBE)
    assert right.passed and wrong.status == "failed", (right, wrong)
    assert probe.passed, probe.detail


TGKILL, TKILL, KEYCTL = {"x86_64": (234, 200, 250), "aarch64": (131, 130, 219)}.get(platform.machine(), (-1,) * 3)
HOSTILE = {
    "files": (
        "import os\n"
        "for d in ('/tmp', '/dev/shm'):\n"
        "    open(d + '/left', 'w').write('x')\n"
        "    os.makedirs(d + '/deep/er', exist_ok=True)\n"
        "    open(d + '/deep/er/f', 'w').write('y')\n"
        "os.mkdir('/tmp/locked')\nopen('/tmp/locked/f', 'w').write('z')\nos.chmod('/tmp/locked', 0)\n"
    ),
    "globals_and_monkeypatching": (
        "import builtins, json, os, sys\n"
        "global pwned\npwned = True\n"
        "builtins.pwn_flag = 1\nbuiltins.len = lambda x: 0\njson.dumps = lambda *a, **k: 'pwned'\n"
        "os.getcwd = lambda: '/pwned'\nsys.modules['threading'] = None\nos.chdir('/')\n"
    ),
    "threads_left_running": (
        "import os, threading, time\n"
        "def linger():\n"
        "    time.sleep(0.2)\n"
        "    for fd in range(64):\n"
        "        try:\n            os.write(fd, b'x ok 0\\nx end\\n')\n"
        "        except OSError:\n            pass\n"
        "threading.Thread(target=linger).start()\nthreading.Thread(target=linger, daemon=True).start()\n"
    ),
    "signals_to_the_zygote_and_init": (
        "import os, signal\nerrors = 0\n"
        "for pid in (os.getppid(), 1, -1, -os.getppid(), os.getpid() + 1, 300):\n"
        "    for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL, signal.SIGUSR1):\n"
        "        try:\n            os.kill(pid, sig)\n"
        "        except PermissionError:\n            errors += 1\n"
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"errors += libc.syscall({TGKILL}, 1, 1, signal.SIGKILL) == -1\n"
        f"errors += libc.syscall({TKILL}, 1, signal.SIGKILL) == -1\n"
        # The zygote's memory and its control pipes (a forged answer would shift the next program's verdict).
        "for attempt in (lambda: open('/proc/1/mem', 'r+b'), lambda: open('/proc/1/fd/0', 'rb'),\n"
        "                lambda: open('/proc/1/fd/1', 'wb'), lambda: os.readlink('/proc/1/fd/1')):\n"
        "    try:\n        attempt()\n"
        "    except PermissionError:\n        errors += 1\n"
        "assert os.getppid() == 1 and errors == 30, errors\n"
    ),
    "forged_answers": (  # an answer frame the grader would take for this run, the real one then for the next
        "import marshal, os\n"
        "body = marshal.dumps({'records': b'', 'output': b'', 'killed': False, 'returncode': 0, 'dirty': False})\n"
        "frame = len(body).to_bytes(4, 'little') + body\n"
        "for path in ('/proc/1/fd/1', '/proc/1/fd/0', '/proc/1/fd/2'):\n"
        "    try:\n        open(path, 'wb').write(frame)\n"
        "    except OSError:\n        pass\n"
        "for fd in range(64):\n"
        "    try:\n        os.write(fd, frame)\n"
        "    except OSError:\n        pass\n"
    ),
    "dev_altered": "import os\nos.unlink('/dev/stdin')\nos.symlink('/tmp/evil', '/dev/stdin')\nopen('/dev/new', 'w')\n",
    "scratch_permissions": "import os\nos.chmod('/tmp', 0)\nos.chmod('/dev/shm', 0)\n",
    "sysv_and_posix_ipc": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.shmget(0, 1 << 20, 0o1600) == -1 and ctypes.get_errno() == 1\n"
        f"assert libc.syscall({KEYCTL}, 0, -3, 0, 0) == -1 and ctypes.get_errno() == 1\n"
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_program_cannot_change_the_next_ones(box, name):
    result = box.run(CodeJob(program=HOSTILE[name], checks=("assert True",)))
    if name == "signals_to_the_zygote_and_init":
        assert result.passed, result.detail  # every attempt refused (EPERM), and the program went on
        assert box.restarts == 0  # refused, not survived by a restart
    assert_next_programs_judged_right(box)


def test_dirty_state_restarts_the_zygote(box):
    box.run(RIGHT)
    assert box.restarts == 0
    box.run(CodeJob(program=HOSTILE["dev_altered"], checks=("assert True",)))
    assert box.restarts == 1
    ignores_alarm = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n"
    assert box.run(CodeJob(program=ignores_alarm, checks=("assert True",))).status == "timeout"  # killed
    assert box.restarts == 2
    assert_next_programs_judged_right(box)


def test_start_up_check_starts_a_zygote_per_worker():
    with CodeSandbox(SandboxSettings(timeout=1.0, num_workers=3, guard="none")) as sandbox:
        assert len(sandbox._zygotes) == 3
        results = sandbox.run_many([RIGHT, WRONG, PROBE] * 3)
        assert [r.status for r in results] == ["passed", "failed", "passed"] * 3
        assert len(sandbox._zygotes) == 3 and sandbox.restarts == 0
        zygotes = list(sandbox._zygotes)
    assert all(z.process.poll() is not None for z in zygotes)  # closing the sandbox ends them


def test_honest_programs_reuse_one_zygote(box):
    results = box.run_many([RIGHT, WRONG, PROBE] * 5)
    assert [r.status for r in results] == ["passed", "failed", "passed"] * 5
    assert box.restarts == 0 and len(box._zygotes) == 1


def test_a_zygote_ended_mid_job_is_replaced_and_the_job_judged_in_its_own_sandbox(box):
    box.run(RIGHT)
    [zygote] = box._zygotes
    slow = CodeJob(program="import time\ntime.sleep(0.5)\nx = 1\n", checks=("assert x == 1",))
    timer = threading.Timer(0.2, lambda: zygote.process.kill())  # the host ends the zygote during the job
    timer.start()
    result = box.run(slow)
    timer.join()
    assert result.passed, result.detail  # judged again per program, not scored as a failure
    assert box.restarts == 1 and zygote not in box._zygotes
    assert_next_programs_judged_right(box)


def test_the_zygote_refuses_to_run_outside_a_pid_namespace():
    # It kills every other process of its PID namespace after each job: on the host that would be the user's.
    run = subprocess.run([sys.executable, "-I", "-S", sandbox_module.HARNESS_PATH, "--zygote"], input=b"",
                         capture_output=True, timeout=30)  # fmt: skip
    assert run.returncode == 2 and b"PID namespace" in run.stderr


def test_timeout_kills_the_child_and_what_it_started():
    settings = SandboxSettings(timeout=1.0, grace=0.5, num_workers=1, guard="none", max_processes=8)
    with CodeSandbox(settings) as box:
        program = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\ntime.sleep(30)\n"
        start = time.monotonic()
        assert box.run(CodeJob(program=program, checks=("assert True",))).status == "timeout"
        assert time.monotonic() - start < 1.0 + 0.5 + 2.0
        assert box.run(PROBE).passed


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"mode": "fork"}, ["mode", "fork", "zygote"]),
        ({"mode": "zygote", "backend": "unsafe_local"}, ["mode", "bwrap", "per_program"]),
    ],
)
def test_mode_setting_is_checked(kwargs, words):
    with pytest.raises(ValueError) as error:
        SandboxSettings(**kwargs)
    assert all(word in str(error.value) for word in words)
    assert SandboxSettings().run_mode == "zygote"
    assert SandboxSettings(backend="unsafe_local").run_mode == "per_program"


def test_child_filter_has_the_pid_markers_and_fits():
    for machine in ("x86_64", "aarch64"):
        program = child_filter(machine)
        values = {int.from_bytes(program[i + 4 : i + 8], "little") for i in range(0, len(program), 8)}
        assert {sandbox_module.PID_MARK, sandbox_module.NEG_PID_MARK} <= values
        assert len(program) % 8 == 0 and len(program) // 8 < 256
    assert child_filter("riscv64") is None
