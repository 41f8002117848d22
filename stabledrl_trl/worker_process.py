"""Run a benchmark's measuring worker in a fresh process and say why it failed when it does.

`subprocess.run(..., check=True, capture_output=True)` raises CalledProcessError, whose message holds the command and
the exit status but not the worker's own error (its stderr was captured and dropped). `run_worker` raises a
RuntimeError with the exit status and the end of the worker's stderr instead, so the reason shows where the user
looks.
"""

from __future__ import annotations

import subprocess

STDERR_TAIL = 3000  # characters of the worker's stderr shown


class WorkerError(RuntimeError):
    """A measuring worker exited with a non-zero status; the message holds its stderr's end."""


def run_worker(cmd: list[str], env: dict, what: str) -> str:
    """Run `cmd` (the interpreter that started the caller should be cmd[0]: sys.executable) and return its stdout;
    `what` names the measurement in the error."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = proc.stderr[-STDERR_TAIL:].strip() or "(nothing on stderr)"
        raise WorkerError(f"the worker measuring {what} exited with status {proc.returncode}:\n{tail}")
    return proc.stdout
