"""What changes when training spans several machines: shared directories, one writer, and the check of both.

A multi-node run (N nodes x G processes, `torch.distributed` initialised by the launcher) assumes that the
directories every process reads what one process wrote are on a filesystem all nodes see (NFS, Lustre, GPFS, ...):

- `output_dir`: checkpoints are written once, by global rank 0 (transformers' `should_save`), and every rank reads
  the same checkpoint on resume. With `save_on_each_node=True` each node's local rank 0 writes its own copy
  instead, and `output_dir` may be node-local.
- `sft_cache_dir` (the embedded tiny default's warm-up): every rank trains the warm-up together, global rank 0 writes
  the checkpoint, the others read it.
- Hugging Face dataset caches: global rank 0 loads (and caches) first, the others after it; this is right on a shared
  cache and on node-local caches alike (each node then fills its own, under `datasets`' file lock).

`check_shared_directory` verifies the assumption at start-up: global rank 0 writes a marker with a token drawn for
this run, every rank looks for it (waiting up to `timeout` seconds for a network filesystem's caches), the answers
are gathered, and *every* rank raises the same error naming the field, the ranks and hosts that could not see it, and
the fix, instead of one node failing later (or hanging at a barrier) on a missing checkpoint.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

import torch.distributed as dist

MARKER_PREFIX = ".stabledrl-shared-check-"


def world() -> tuple[int, int]:
    """(global rank, world size) of the initialised process group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def num_nodes() -> int:
    """Number of machines of this launch, from torchrun's WORLD_SIZE / LOCAL_WORLD_SIZE (1 when not launched)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    return max(1, world_size // max(1, local))


def broadcast_object(value):
    """`value` of global rank 0 on every rank (identity without a process group)."""
    if world()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if world()[1] > 1:
        dist.barrier()


def check_shared_directory(path: str, field: str, *, timeout: float = 10.0, poll: float = 0.2) -> None:
    """Raise on every rank unless `path` is one directory that every rank of the process group sees.

    Global rank 0 creates `path` and writes `path/.stabledrl-shared-check-<token>` (token drawn for this call and
    broadcast); each rank waits up to `timeout` seconds for the file with that token; the results are all-gathered.
    A no-op without an initialised process group or with one process.
    """
    rank, world_size = world()
    if world_size == 1:
        return
    token = broadcast_object(uuid.uuid4().hex if rank == 0 else None)
    marker = os.path.join(path, MARKER_PREFIX + token)
    if rank == 0:
        os.makedirs(path, exist_ok=True)
        tmp = f"{marker}.tmp"
        with open(tmp, "w") as f:
            f.write(token)
        os.replace(tmp, marker)  # complete or absent, never half-written
    barrier()
    deadline = time.monotonic() + timeout
    while True:
        seen = _read(marker) == token
        if seen or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    answers = [None] * world_size
    dist.all_gather_object(answers, (rank, socket.gethostname(), os.path.abspath(path), seen))
    barrier()  # every rank has looked before rank 0 removes the marker
    if rank == 0:
        try:
            os.remove(marker)
        except OSError:
            pass
    blind = [a for a in answers if not a[3]]
    if blind:
        where = ", ".join(f"rank {r} on {h} ({p})" for r, h, p, _ in blind[:8])
        more = f" and {len(blind) - 8} more" if len(blind) > 8 else ""
        raise RuntimeError(
            f"{field}={path!r} is not shared by every process: {where}{more} cannot see the file global rank 0 "
            f"wrote there ({os.path.basename(marker)}, waited {timeout:g} s). A multi-node run needs {field} on a "
            "filesystem every node mounts at the same path (NFS, Lustre, ...): give an absolute path on it"
            + (
                ", or set save_on_each_node=True to keep one copy of each checkpoint per node."
                if field == "output_dir"
                else "."
            )
        )


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


_EXIT_HOOK = []


def leave_process_group_at_exit() -> None:
    """Make every process of a distributed run leave the process group together when the interpreter exits.

    A training script (TRL's examples included) usually ends without `destroy_process_group()`. With gloo (CPU runs),
    the process group is then torn down by the interpreter's shutdown, and a rank whose peer has already gone can be
    aborted there ("terminate called without an active exception"), so a run that trained and saved exits non-zero.
    Registered once; at exit it waits for every rank (gloo's `monitored_barrier`, bounded: a rank that crashed does
    not hang the others), then destroys the group. A script that destroys the group itself is left alone.
    """
    if _EXIT_HOOK:
        return
    import atexit

    _EXIT_HOOK.append(True)
    atexit.register(_leave_process_group)


def _leave_process_group(timeout_s: float = 120.0) -> None:
    from datetime import timedelta

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_backend() == "gloo" and dist.get_world_size() > 1:
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
        dist.destroy_process_group()
    except Exception:  # a peer is gone (it failed): leave the rest to the launcher, which reports that failure
        pass
