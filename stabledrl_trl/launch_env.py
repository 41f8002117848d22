"""The launch environment, checked when a `StableDRLConfig` is built, before accelerate reads it.

accelerate and torch.distributed read the launcher's variables (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, ...) when
the config sets up its device. Left over in a shell, or set by hand, they fail in ways that do not say why:

- WORLD_SIZE=2 in a process that no launcher started: rank 0 waits for a peer that never comes (the rendezvous
  timeout is 30 minutes), or, without MASTER_ADDR, fails with a message about multi-node launches;
- WORLD_SIZE=abc: a bare `int()` traceback inside accelerate;
- a stale RANK >= WORLD_SIZE, or a RANK without WORLD_SIZE: a hang or a misleading rendezvous error.

`check_launch_environment` turns each into an error naming the variable, its value and the fix. A process counts as
launched when a launcher's own marker is in its environment (`LAUNCHER_MARKERS`: torchrun / accelerate launch,
DeepSpeed, MPI, srun); a launcher this list does not know can say so with STABLEDRL_LAUNCHED=1.

`expand_path` expands `~` and `$VAR` / `${VAR}` in a path field (output_dir), as a shell would: a YAML config or a
Python string is not expanded by a shell, so `output_dir: $HOME/runs` would create a folder literally named `$HOME`.
A variable that is not set is an error (expanding it to nothing would write somewhere else).
"""

from __future__ import annotations

import os
import re

# Variables whose presence means a launcher started this process.
LAUNCHER_MARKERS = (
    "TORCHELASTIC_RUN_ID",  # torchrun, accelerate launch (multi-process), python -m torch.distributed.run
    "CROSS_SIZE",  # DeepSpeed's launcher
    "OMPI_COMM_WORLD_SIZE",  # Open MPI (accelerate's multi-CPU mpirun)
    "PMI_SIZE",  # MPICH / Intel MPI
    "PMIX_RANK",
    "SLURM_STEP_NUM_TASKS",  # srun
    "STABLEDRL_LAUNCHED",  # any other launcher, by the user's word
)
INT_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_PORT")
_DISTRIBUTED = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class LaunchEnvironmentError(RuntimeError):
    """An environment variable of the launch that cannot be right; the message names it and the fix."""


def _unset_hint() -> str:
    return (
        "For one process: unset " + " ".join(_DISTRIBUTED) + " (e.g. `env -u WORLD_SIZE -u RANK ... python ...`). "
        "For several: start them with `accelerate launch` or `torchrun`, which set these variables."
    )


def check_launch_environment(environ=None) -> None:
    """Raise LaunchEnvironmentError for launch variables that cannot be right (see the module docstring)."""
    env = os.environ if environ is None else environ
    values = {}
    for name in INT_VARIABLES:
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            raise LaunchEnvironmentError(
                f"Environment variable {name}={raw!r} is not an integer; launchers set it to a number. "
                + _unset_hint()
            ) from None
        if values[name] < 0 or (name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE") and values[name] < 1):
            raise LaunchEnvironmentError(
                f"Environment variable {name}={raw} is out of range ({'>= 1' if 'SIZE' in name else '>= 0'}). "
                + _unset_hint()
            )
    world = values.get("WORLD_SIZE", 1)
    for rank, size in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        if rank in values and values[rank] >= values.get(size, world if size == "LOCAL_WORLD_SIZE" else 1):
            bound = values.get(size, world if size == "LOCAL_WORLD_SIZE" else 1)
            raise LaunchEnvironmentError(
                f"Environment variable {rank}={values[rank]} is not below {size}={bound}"
                f"{'' if size in values else ' (unset: 1)'}: it is left over from another launch. " + _unset_hint()
            )
    launched = any(env.get(marker) for marker in LAUNCHER_MARKERS)
    if world > 1 and not launched:
        raise LaunchEnvironmentError(
            f"WORLD_SIZE={world} is set but no launcher started this process (none of {', '.join(LAUNCHER_MARKERS[:-1])} "
            f"is set): it would wait for {world - 1} other process(es) that never come. {_unset_hint()} If your "
            "launcher sets WORLD_SIZE itself, set STABLEDRL_LAUNCHED=1 as well."
        )


_VARIABLE = re.compile(r"\$(\w+)|\$\{([^}]*)\}")


def expand_path(name: str, value, environ=None):
    """`value` with `~` and environment variables expanded; an unset variable is an error naming the field."""
    if not isinstance(value, str) or ("$" not in value and not value.startswith("~")):
        return value
    env = os.environ if environ is None else environ
    missing = [m.group(1) or m.group(2) for m in _VARIABLE.finditer(value) if (m.group(1) or m.group(2)) not in env]
    if missing:
        raise ValueError(
            f"{name}={value!r} uses the environment variable {missing[0]!r}, which is not set. Set it, or write the "
            "path out."
        )
    expanded = _VARIABLE.sub(lambda m: env[m.group(1) or m.group(2)], value)
    return os.path.expanduser(expanded)
