"""The test harness that runs INSIDE the code sandbox (`stabledrl_trl.sandbox`); a standalone script.

It imports nothing from the package. It is started as `python -I -S code_harness.py RESULT_FD` in a
fresh interpreter (no `site`: the site-packages directories are put on sys.path directly), inside bubblewrap or
the unsafe local runner, and does, in this order, before any untrusted code runs:

1. applies the resource limits the grader sent (soft = hard, so the program cannot raise them): CPU
   seconds, address space, file size, open files, core size 0, and either a seccomp filter that refuses every new
   process (`max_processes == 1`: fork, vfork, clone without CLONE_THREAD, clone3 -> ENOSYS so glibc falls back to
   clone; threads still work) or RLIMIT_NPROC;
2. has read the limits and the job (a marshal-encoded dict on stdin: the nonce, the untrusted program, the trusted
   test source and checks) and points stdin at /dev/null;
3. writes `<nonce> start` on the result descriptor (a pipe only the grader reads);
4. compiles the trusted test source and checks, snapshots the builtins, and optionally applies the official
   harness's guard (`guard == "official"`: the same functions disabled as `reliability_guard` in the official
   `custom_humaneval/execution.py`, so a program calling `os.remove` fails here as it fails there);
5. runs the program (`exec` in a fresh, empty namespace, as the official harness does), with Python-level stdout and
   stderr going to a bounded in-memory sink and reads from stdin raising, under a SIGALRM time limit;
6. gives the namespace a copy of the builtins as they were before the program ran, runs the test source in it, and
   then each check in turn, writing `<nonce> ok <i>` or `<nonce> fail <i> <exception>` after each; a check that
   calls a test function calls the function the TRUSTED test source bound to that name (its code object must be
   one compiled from the test source, a wrapper defined there included), never a function of the program, and
   trace/profile hooks are cleared before each check;
7. writes `<nonce> end` and leaves with `os._exit(0)` (no atexit hooks, no waiting for the program's threads).

Zygote mode (`code_harness.py --zygote`, only as the first process of a fresh PID namespace): the interpreter starts
once per sandbox, then reads jobs (length-prefixed marshal on fd 0) and for each forks a child that resets its
signals, takes a new process group, works in /tmp, and runs steps 1-7 above (the seccomp filter then also confines
its signals to itself, see `sandbox.child_filter`); the zygote reads the child's records and output (bounded),
kills it at `timeout + grace`, kills every other process of the namespace and reaps them (it is the namespace's
init), empties /tmp and /dev/shm, and answers with the records, the output and whether anything it checks was
left changed ("dirty": the grader then ends this sandbox). The zygote is not dumpable and ignores catchable signals.

The grader (outside) decides pass/fail from these records alone: every check `ok`, none `fail`, `end` present,
all carrying the nonce it drew for this run. The exit status and the program's output are never read for the
verdict. What this does and does not protect against is written in docs/code.md.
"""

import _signal  # the C module: `signal` imports enum, 15 ms of every start
import builtins
import marshal
import os
import sys

START, OK, FAIL, END, PROGRAM_ERROR, TESTS_ERROR = "start", "ok", "fail", "end", "program_error", "tests_error"

# The names the official harness's `reliability_guard` disables (module, attribute, replacement kind).
_OFFICIAL_RAISING_OS = ("system", "kill", "setuid", "fork")
_OFFICIAL_NONE_OS = (
    "putenv", "remove", "removedirs", "rmdir", "fchdir", "forkpty", "killpg", "rename", "renames", "truncate",
    "replace", "unlink", "fchmod", "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd",
    "chdir",
)  # fmt: skip
_OFFICIAL_NONE_SHUTIL = ("rmtree", "move", "chown")
_OFFICIAL_NONE_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter")


class HarnessTimeout(Exception):
    """Raised by the SIGALRM handler when the program and its checks exceed the time limit."""


class _BoundedSink:
    """A write-only text stream keeping the first `limit` characters (the official harness swallows output)."""

    def __init__(self, limit):
        self.limit = limit
        self.parts = []
        self.size = 0

    def write(self, text):
        text = str(text)
        if self.size < self.limit:
            self.parts.append(text[: self.limit - self.size])
        self.size += len(text)
        return len(text)

    def flush(self):
        pass

    def writable(self):
        return True

    def readable(self):
        return False

    def isatty(self):
        return False

    def read(self, *args, **kwargs):
        raise OSError("stdin is not readable in the sandbox")

    readline = readlines = read

    def fileno(self):
        raise OSError("no file descriptor")


def _apply_limits(limits):
    import resource

    def hard(name, value):
        resource.setrlimit(name, (value, value))

    hard(resource.RLIMIT_CORE, 0)
    hard(resource.RLIMIT_CPU, int(limits["cpu_seconds"]))
    hard(resource.RLIMIT_AS, int(limits["memory_bytes"]))
    hard(resource.RLIMIT_FSIZE, int(limits["file_bytes"]))
    hard(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    if limits.get("seccomp_filter"):
        program = bytes.fromhex(limits["seccomp_filter"])
        if limits.get("pid_placeholders"):
            program = _with_pid(program, *limits["pid_placeholders"])
        _install_seccomp(program)
    if limits.get("max_processes"):
        hard(resource.RLIMIT_NPROC, int(limits["max_processes"]))


def _with_pid(program, pid_mark, negative_mark):
    """The filter with this process's pid (and its negation, a process group) in place of the grader's markers."""
    import struct

    pid = os.getpid()
    out = []
    for i in range(0, len(program), 8):
        op, jt, jf, k = struct.unpack("=HBBI", program[i : i + 8])
        if k == pid_mark:
            k = pid
        elif k == negative_mark:
            k = (-pid) & 0xFFFFFFFF
        out.append(struct.pack("=HBBI", op, jt, jf, k))
    return b"".join(out)


def _install_seccomp(program):
    """Install a classic-BPF seccomp filter (`program`: packed sock_filter structs) for this process and its threads."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _official_guard(text):
    """Disable what the official harness's `reliability_guard` disables (not a security measure: parity only).

    shutil and subprocess (25 ms of imports) are imported and patched only when `text` (the program and tests)
    names them; a program reaching them by a computed name gets them unpatched (the sandbox still holds).
    """

    def _disabled(*args, **kwargs):
        raise RuntimeError("Restricted system call")

    import faulthandler

    faulthandler.disable()
    builtins.exit = None
    builtins.quit = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in _OFFICIAL_RAISING_OS:
        setattr(os, name, _disabled)
    for name in _OFFICIAL_NONE_OS:
        setattr(os, name, None)
    if "shutil" in text:
        import shutil

        for name in _OFFICIAL_NONE_SHUTIL:
            setattr(shutil, name, None)
    if "subprocess" in text:
        import subprocess

        subprocess.Popen = None
    builtins.help = None
    for name in _OFFICIAL_NONE_MODULES:
        sys.modules[name] = None


def main():
    if sys.argv[1] == "--zygote":
        zygote()
        return
    result_fd = int(sys.argv[1])
    # The job: a marshal-encoded dict written by the grader (trusted data; marshal needs no imports, json needs re).
    message = marshal.loads(sys.stdin.buffer.read())
    sys.path.extend(message["limits"].get("site_paths", ()))  # started with -S (no site: 50 ms less)
    run_job(message, result_fd)


def run_job(message, result_fd):
    """Apply the limits, run the program and the checks, write the records on `result_fd`; never returns."""
    limits, job = message["limits"], message["job"]
    write = os.write
    exit_now = os._exit
    settrace, setprofile, setitimer = sys.settrace, sys.setprofile, _signal.setitimer
    code_type = type(main.__code__)

    _apply_limits(limits)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    nonce = job.pop("nonce")

    def describe(error):
        """`Type: message` on one line, at most 200 characters; never raises (the exception is untrusted)."""
        try:
            text = f"{type(error).__name__}: {error}"
        except BaseException:  # noqa: B036
            text = "unprintable exception"
        return " ".join(text.split())[:200]

    def report(*fields):
        line = " ".join([nonce, *map(str, fields)]) + "\n"
        try:
            write(result_fd, line.encode("utf-8", "replace"))
        except OSError:
            pass

    report(START)
    tests_code = compile(job["tests"], "<tests>", "exec")
    checks = []
    for i, check in enumerate(job["checks"]):
        if "call" in check:
            checks.append(("call", check["call"]))
        else:
            checks.append(("exec", compile(check["exec"], f"<check {i}>", "exec")))
    trusted_functions = {c.co_name: c for c in tests_code.co_consts if isinstance(c, code_type)}
    trusted_codes, pending = [], [tests_code]  # every code object of the test source, nested ones (wrappers) too
    while pending:
        code = pending.pop()
        trusted_codes.append(code)
        pending.extend(c for c in code.co_consts if isinstance(c, code_type))
    trusted_ids = {id(c) for c in trusted_codes}  # identity: an equal code object built by the program is not it
    for kind, value in checks:
        if kind == "call" and value not in trusted_functions:
            raise ValueError(f"check calls {value!r}, which the test source does not define at top level")
    clean_builtins = dict(builtins.__dict__)
    stop_at_first_failure = bool(job.get("stop_at_first_failure", True))
    program = job.pop("program")

    def on_alarm(signum, frame):
        raise HarnessTimeout("time limit")

    _signal.signal(_signal.SIGALRM, on_alarm)
    sink = _BoundedSink(int(limits["output_chars"]))
    sys.stdout = sys.stderr = sys.stdin = sink
    if job.get("guard") == "official":
        # The official harness forks the grading process, so modules that process had imported stay importable
        # after its guard; importing them after the guard fails (numpy reads os functions the guard removes).
        for name in job.get("preload", ()):
            try:
                __import__(name)
            except ImportError:
                pass
        _official_guard(program + "\n" + job["tests"] + "\n" + "\n".join(map(str, job["checks"])))
    namespace = {}
    setitimer(_signal.ITIMER_REAL, float(limits["timeout"]))
    try:
        exec(compile(program, "<program>", "exec"), namespace)
    except BaseException as error:  # noqa: B036 - SystemExit and KeyboardInterrupt are failures too
        report(PROGRAM_ERROR, describe(error))
        exit_now(0)
    try:
        settrace(None)
        setprofile(None)
        namespace["__builtins__"] = dict(clean_builtins)
        exec(tests_code, namespace)
        functions = {}
        for kind, value in checks:
            if kind == "call":
                function = namespace.get(value)
                if id(getattr(function, "__code__", None)) not in trusted_ids:
                    raise RuntimeError(f"test function {value!r} was replaced")
                functions[value] = function
    except BaseException as error:  # noqa: B036
        report(TESTS_ERROR, describe(error))
        exit_now(0)
    for i, (kind, value) in enumerate(checks):
        try:
            settrace(None)
            setprofile(None)
            if kind == "call":
                functions[value]()
            else:
                exec(value, namespace)
        except BaseException as error:  # noqa: B036
            report(FAIL, i, describe(error))
            if stop_at_first_failure or isinstance(error, HarnessTimeout):
                break
        else:
            report(OK, i)
    try:
        setitimer(_signal.ITIMER_REAL, 0)
    except BaseException:  # noqa: B036 - the alarm fired after the last check: no end record, a failure
        exit_now(0)
    report(END)
    exit_now(0)


# ----------------------------------------------------------------------------------------------------------------
# the zygote: one long-lived interpreter per sandbox, forking a child per program


def _read_exact(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _send(fd, value):
    data = marshal.dumps(value)
    view = memoryview(len(data).to_bytes(4, "little") + data)
    while view:
        view = view[os.write(fd, view) :]


def _state():
    """What a program may not leave changed for the next one, beyond the scratch directories' contents."""
    dev = []
    for entry in sorted(os.scandir("/dev"), key=lambda e: e.name):
        if entry.name != "shm":
            dev.append((entry.name, os.readlink(entry.path) if entry.is_symlink() else entry.is_dir()))
    return {"tmp": os.lstat("/tmp").st_mode, "shm": os.lstat("/dev/shm").st_mode, "dev": dev, "cwd": os.getcwd()}


def _clean(snapshot):
    """Empty /tmp and /dev/shm; True ("dirty": restart this sandbox) if that failed or anything else changed."""
    import shutil

    dirty = False
    for path in ("/tmp", "/dev/shm"):
        try:
            for entry in list(os.scandir(path)):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            dirty = dirty or bool(os.listdir(path))
        except OSError:
            dirty = True
    try:
        return dirty or _state() != snapshot
    except OSError:
        return True


def _serve(message):
    """Fork a child that runs one job (`run_job`); collect its records and bounded output; leave nothing behind."""
    import select

    limits = message["limits"]
    out_r, out_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the program's process
        try:
            os.setpgid(0, 0)
            os.chdir("/tmp")
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            os.dup2(res_w, 3)
            os.closerange(4, 1 << 16)  # the zygote's control pipes (0, 1) are gone too
            for signum in range(1, _signal.NSIG):
                if signum in (_signal.SIGKILL, _signal.SIGSTOP, _signal.SIGPIPE, _signal.SIGXFSZ):
                    continue  # Python's own start-up ignores SIGPIPE and SIGXFSZ
                try:
                    _signal.signal(signum, _signal.SIG_DFL)
                except (OSError, ValueError, RuntimeError):
                    pass
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
            run_job(message, 3)
        finally:
            os._exit(70)
    os.close(out_w)
    os.close(res_w)
    pidfd = os.pidfd_open(pid)
    deadline = _monotonic() + float(limits["timeout"]) + float(message["grace"])
    output, records = bytearray(), bytearray()
    streams = {out_r: (output, int(limits["output_chars"])), res_r: (records, int(message["record_cap"]))}
    killed, alive = False, True

    def take(fd, chunk):
        target, cap = streams[fd]
        target += chunk[: max(0, cap - len(target))]
        if not chunk or len(target) >= cap:
            del streams[fd]
            os.close(fd)  # past the cap the writer gets EPIPE, as with a per-program sandbox

    while alive:
        remaining = deadline - _monotonic()
        if remaining <= 0:
            killed = True
            break
        ready, _, _ = select.select([*streams, pidfd], [], [], remaining)
        for fd in ready:
            if fd == pidfd:
                alive = False
            elif fd in streams:
                take(fd, os.read(fd, 65536))
    for target in (pid, -pid):
        try:
            os.kill(target, _signal.SIGKILL)
        except OSError:
            pass
    os.kill(-1, _signal.SIGKILL)  # every process of this PID namespace except this one, its init
    _, status = os.waitpid(pid, 0)
    while True:  # the init: every process of the namespace is reaped here, so none is left when this loop ends
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    for fd in list(streams):  # every writer is dead: read what is left, up to the caps
        while fd in streams:
            take(fd, os.read(fd, 65536))
    os.close(pidfd)
    returncode = os.waitstatus_to_exitcode(status)
    return {"records": bytes(records), "output": bytes(output), "killed": killed, "returncode": returncode}


def _monotonic():
    return __import__("time").monotonic()


def zygote():
    """Serve jobs (length-prefixed marshal on fd 0, answers on fd 1) until the grader closes fd 0.

    Runs only as the init (pid 1) of a fresh PID namespace (`bwrap --as-pid-1`): it kills every other process of the
    namespace after each job, which must never reach processes outside a sandbox. Being the init also means no other
    process holds its control pipes (a program cannot open them through /proc/1/fd: this process is not dumpable)
    and no process of the namespace can kill or stop it.
    """
    if os.getpid() != 1:
        os.write(2, b"code_harness --zygote runs only inside a fresh PID namespace (bubblewrap)\n")
        os._exit(2)
    import ctypes
    import resource  # noqa: F401 - the children's imports, paid once here
    import select  # noqa: F401
    import shutil  # noqa: F401
    import struct  # noqa: F401
    import time  # noqa: F401

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_dumpable = 4
    if libc.prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl failed")  # not dumpable: no ptrace, no /proc/<pid>/mem of this
    for signum in range(1, _signal.NSIG):
        if signum not in (_signal.SIGKILL, _signal.SIGSTOP, _signal.SIGCHLD):
            try:
                _signal.signal(signum, _signal.SIG_IGN)
            except (OSError, ValueError, RuntimeError):
                pass
    handshake = marshal.loads(_read_exact(0, int.from_bytes(_read_exact(0, 4), "little")))
    sys.path.extend(handshake.get("site_paths", ()))
    os.chdir("/")
    import faulthandler  # noqa: F401 - imported by the official guard in every child
    import gc

    gc.collect()
    gc.freeze()  # the children's collections then skip the zygote's objects (fewer copy-on-write page faults)
    snapshot = _state()
    _send(1, {"ready": True})
    while True:
        header = _read_exact(0, 4)
        if header is None:
            os._exit(0)
        message = marshal.loads(_read_exact(0, int.from_bytes(header, "little")))
        response = _serve(message)
        response["dirty"] = _clean(snapshot)
        _send(1, response)


if __name__ == "__main__":
    main()
