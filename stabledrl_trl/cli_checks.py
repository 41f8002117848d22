"""Number flags of the benchmark scripts, checked right after parsing: one usage error, never a traceback.

argparse's `type=int` / `type=float` accept any integer or float, so `--batch-size -1`, `--steps 0` or
`--temperature nan` reached the scripts' code and failed there with a bare traceback (a negative tensor size, a
division by zero) or, worse, ran. `parse_checked` parses, then checks every number-typed flag given:

- integers: >= 1, or >= 0 for a flag whose default is 0 or whose name is a seed, a warm-up, a worker index or in
  `zero_ok` (their 0 has a meaning);
- floats: finite and >= 0, > 0 for a flag in `positive`.

A bad value ends the script through `parser.error` (usage, the flag, the value, the rule; exit status 2).
"""

from __future__ import annotations

import argparse
import math

_ZERO_WORDS = ("seed", "warmup", "worker")


def _minimum(action: argparse.Action, zero_ok) -> int:
    name = action.dest
    if action.default == 0 or any(w in name for w in _ZERO_WORDS) or name in zero_ok:
        return 0
    return 1


def check_number_flags(parser: argparse.ArgumentParser, args, zero_ok=(), positive=()) -> None:
    """`parser.error` for the first number-typed flag of `args` out of its range (see the module docstring)."""
    for action in parser._actions:  # argparse keeps its actions here; there is no public accessor
        if action.type not in (int, float) or not action.option_strings:
            continue
        value = getattr(args, action.dest, None)
        flag = action.option_strings[-1]
        for v in value if isinstance(value, list) else [value]:
            if v is None or v == action.default:
                continue
            if action.type is int and v < _minimum(action, zero_ok):
                parser.error(f"{flag} {v}: must be an integer >= {_minimum(action, zero_ok)}")
            if action.type is float and (not math.isfinite(v) or v < 0 or (action.dest in positive and v <= 0)):
                rule = "> 0" if action.dest in positive else ">= 0"
                parser.error(f"{flag} {v}: must be a finite number {rule}")


def parse_checked(parser: argparse.ArgumentParser, argv=None, zero_ok=(), positive=("learning_rate",)):
    """`parser.parse_args(argv)`, then `check_number_flags`."""
    args = parser.parse_args(argv)
    check_number_flags(parser, args, zero_ok=zero_ok, positive=positive)
    return args
