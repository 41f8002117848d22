"""One training run per output folder: an exclusive lock on `output_dir/LOCK_FILE` for the whole of `train()`.

Two runs started into the same output_dir would otherwise both pass the fresh-folder check (neither has saved a
checkpoint yet), write their checkpoints into the same folder and both exit 0; a later resume would then pick
whichever saved last. The lock is an advisory `fcntl.flock` taken without waiting by the process that writes the
checkpoints (the main process): a second run is refused at once with a message naming the folder and, when it is
readable, the process holding it. The operating system drops the lock when its process ends, however it ends, so a
killed run leaves no stale lock; the file itself stays (it is empty but for the holder's description).

On a file system without flock support (some network mounts) the lock cannot be taken: a warning says so and the
run goes on unprotected.
"""

from __future__ import annotations

import errno
import logging
import os
import socket

logger = logging.getLogger(__name__)

LOCK_FILE = ".stabledrl_train.lock"


class OutputDirInUseError(RuntimeError):
    """Another run holds the output folder's lock."""


class OutputDirLock:
    """`with OutputDirLock(output_dir):` holds the folder's lock (created if needed) until the block ends.

    `release()` may be called early; calling it twice is harmless.
    """

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> OutputDirLock:
        import fcntl

        os.makedirs(self.output_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _read_holder(fd)
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputDirInUseError(
                    f"output_dir={self.output_dir!r} is in use by another training run ({holder or 'holder unknown'};"
                    f" lock file {self.path}). Two runs writing one folder mix their checkpoints. Wait for that run "
                    "to end, or choose another output_dir."
                ) from error
            logger.warning(
                f"Cannot lock output_dir={self.output_dir!r} ({error}; the file system may not support flock): "
                "nothing stops a second run from writing into the same folder."
            )
            return self
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        import fcntl

        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> OutputDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""
