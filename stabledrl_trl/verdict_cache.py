"""A cache of the code sandbox's verdicts across reward calls, for programs whose verdict did not depend on time.

RL grades the same program many times: a model that has learned a task keeps writing the same completion for the
same problem, step after step (tiny_code's "e(u(r(s)))"), and a group of G completions often holds copies. Running
such a program again gives the same verdict, so `CodeSandbox` (with `SandboxSettings.verdict_cache_mb > 0`; the
training script's `code_verdict_cache_mb`) looks the verdict up instead.

Key: the SHA-256 of everything that decides a verdict: the program text, the test source, the checks, the test
function names, `stop_at_first_failure`, and every sandbox setting but the worker count and the cache size (backend,
mode, timeout, grace, memory, CPU seconds, processes, file size, open files, output cap, /tmp size, guard). A
different test, check or limit is a different key.

What is stored (`cacheable`): only verdicts the program reached on its own, well inside the time limit: statuses
"passed", "failed", "program_error" and "tests_error" of a run that took at most `TIME_FRACTION` of the timeout.
Never stored: timeouts, crashes (signals, `os._exit`, a limit that killed the process), runs that came near the
time limit (their verdict could change with the machine's load), and sandbox failures (those raise `SandboxError`
and are never a verdict). A hit returns the stored `CodeResult` with `cached=True` (its `seconds` and `output` are
those of the run that produced it).

What it changes: a program whose verdict depends on something other than its text and tests (random numbers, the
clock, `id()` values) keeps the verdict of its first run for as long as it stays in the cache, where running it
again could give another. Set the size to 0 to run every program every time.

Size: least recently used entries are dropped once the stored verdicts (their output and detail texts, plus a fixed
cost per entry) exceed `max_bytes`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import marshal
import threading
from collections import OrderedDict

CACHEABLE_STATUSES = ("passed", "failed", "program_error", "tests_error")
TIME_FRACTION = 0.5  # a run that took more than this share of the timeout is not stored
ENTRY_OVERHEAD = 256  # bytes counted per entry besides its texts (key, object headers)
# Settings that do not change a verdict: how many programs run at once, and the cache itself.
_NOT_IN_KEY = ("num_workers", "verdict_cache_mb")


def settings_key(settings) -> tuple:
    """The sandbox settings that can change a verdict, as a tuple of (name, value) (for `job_key`)."""
    return tuple(
        (f.name, getattr(settings, f.name)) for f in dataclasses.fields(settings) if f.name not in _NOT_IN_KEY
    ) + (("run_mode", settings.run_mode), ("cpu_limit", settings.cpu_limit))


def job_key(job, settings) -> bytes:
    """SHA-256 digest of a job (program, tests, checks, test functions, stop rule) under `settings`."""
    fields = (job.program, job.tests, tuple(job.checks), tuple(job.test_functions), bool(job.stop_at_first_failure))
    data = marshal.dumps((fields, settings_key(settings)))
    return hashlib.sha256(data).digest()


def cacheable(result, timeout: float) -> bool:
    """True when `result` is a verdict the program reached on its own, well inside the time limit."""
    return result.status in CACHEABLE_STATUSES and result.seconds <= TIME_FRACTION * timeout


def _size(result) -> int:
    return ENTRY_OVERHEAD + len(result.output) + len(result.detail)


class VerdictCache:
    """Least-recently-used map from `job_key` digests to `CodeResult`s, bounded by `max_bytes`; thread-safe.

    `hits`, `misses` and `stored` count lookups and insertions (for tests and statistics).
    """

    def __init__(self, max_bytes: int, timeout: float):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes: expected a positive integer, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.timeout = float(timeout)
        self._entries: OrderedDict[bytes, object] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.stored = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, key: bytes):
        """The stored result (marked `cached=True`) or None."""
        with self._lock:
            result = self._entries.get(key)
            if result is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        return dataclasses.replace(result, cached=True)

    def put(self, key: bytes, result) -> bool:
        """Store `result` if `cacheable`; returns whether it was stored."""
        if not cacheable(result, self.timeout):
            return False
        size = _size(result)
        if size > self.max_bytes:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= _size(old)
            self._entries[key] = result
            self._bytes += size
            self.stored += 1
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= _size(dropped)
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


__all__ = ["CACHEABLE_STATUSES", "TIME_FRACTION", "VerdictCache", "cacheable", "job_key", "settings_key"]
