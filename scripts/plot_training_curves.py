"""Plot training curves of one or more runs into one PNG: one subplot per metric, the runs overlaid.

A run is an output folder holding TRL's `trainer_state.json` (or, while training, `checkpoint-N/trainer_state.json`;
the highest N is read), a direct path to a `trainer_state.json`, or a JSONL file of log dicts. The log entries are
dicts with a "step" and metric keys, as in the state's "log_history".

    python scripts/plot_training_curves.py runs/grpo runs/stabledrl --output curves.png --smooth 10
    python scripts/plot_training_curves.py runs/a/trainer_state.json logs.jsonl --labels GRPO StableDRL --metrics completions/mean_length

Default metrics: reward, grad norm, importance-weight mean/max and clip fraction, effective sample size, log-ratio
std and skipped samples. `--metrics` adds more. A metric found in no run is skipped with a printed note.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Sequence

DEFAULT_METRICS = (
    "reward",
    "grad_norm",
    "stabledrl/weight_mean",
    "stabledrl/weight_max",
    "stabledrl/clip_frac",
    "stabledrl/ess",
    "stabledrl/log_ratio_std",
    "stabledrl/skipped",
)


def resolve_log_file(run: str) -> str:
    """The log file of a run: the path itself if it is a file, else the folder's (or latest checkpoint's) state."""
    if os.path.isfile(run):
        return run
    if not os.path.isdir(run):
        raise ValueError(
            f"run: {run!r} is neither a file nor a folder; pass an output_dir, a trainer_state.json or a .jsonl"
        )
    state = os.path.join(run, "trainer_state.json")
    if os.path.isfile(state):
        return state
    checkpoints = []
    for name in os.listdir(run):
        match = re.fullmatch(r"checkpoint-(\d+)", name)
        if match and os.path.isfile(os.path.join(run, name, "trainer_state.json")):
            checkpoints.append((int(match.group(1)), name))
    if not checkpoints:
        raise ValueError(
            f"run: no trainer_state.json in {run!r} or its checkpoint-N folders; did the run log anything?"
        )
    return os.path.join(run, max(checkpoints)[1], "trainer_state.json")


def load_log_history(run: str) -> list[dict]:
    """The list of log dicts of a run (see `resolve_log_file`)."""
    path = resolve_log_file(run)
    if path.endswith(".jsonl"):
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict) and "log_history" in data:
        return list(data["log_history"])
    if isinstance(data, list):
        return data
    raise ValueError(f"run: {path!r} has no 'log_history' list; expected TRL's trainer_state.json or a JSONL of dicts")


def extract_series(log_history: Sequence[dict], metric: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `metric`: the entries holding it with a "step" and a finite numeric value, in log order."""
    steps, values = [], []
    for entry in log_history:
        value, step = entry.get(metric), entry.get("step")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not isinstance(step, (int, float)):
            continue
        if math.isfinite(value):
            steps.append(float(step))
            values.append(float(value))
    return steps, values


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start), same length as `values`."""
    if window < 1:
        raise ValueError(f"--smooth: expected a window of at least 1, got {window}")
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="output folders, trainer_state.json files or .jsonl log files")
    parser.add_argument("--labels", nargs="+", default=None, help="one legend label per run (default: folder name)")
    parser.add_argument("--metrics", nargs="+", default=[], help="metrics to plot in addition to the defaults")
    parser.add_argument("--output", default="training_curves.png", help="PNG file to write")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window in logged points (1: raw)")
    parser.add_argument("--title", default=None, help="figure title")
    return parser


def run_label(run: str) -> str:
    """Legend label of a run: its folder name (the parent folder's for a file inside a run folder)."""
    path = os.path.abspath(run)
    if os.path.isfile(path):
        if os.path.basename(path) == "trainer_state.json":
            path = os.path.dirname(path)
            if re.fullmatch(r"checkpoint-\d+", os.path.basename(path)):
                path = os.path.dirname(path)
        else:
            return os.path.splitext(os.path.basename(path))[0]
    return os.path.basename(path.rstrip(os.sep))


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.labels is not None and len(args.labels) != len(args.runs):
        raise ValueError(f"--labels: got {len(args.labels)} labels for {len(args.runs)} runs; give one per run")
    if args.smooth < 1:
        raise ValueError(f"--smooth: expected a window of at least 1, got {args.smooth}")
    labels = args.labels or [run_label(run) for run in args.runs]
    histories = [load_log_history(run) for run in args.runs]

    metrics = list(dict.fromkeys([*DEFAULT_METRICS, *args.metrics]))
    present = []
    for metric in metrics:
        if any(extract_series(history, metric)[0] for history in histories):
            present.append(metric)
        else:
            print(f"note: metric {metric!r} is in none of the runs; skipped")
    if not present:
        print("note: none of the metrics was found; no plot written")
        return 1

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(3, len(present))
    nrows = math.ceil(len(present) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.5 * nrows), squeeze=False)
    for ax, metric in zip(axes.flat, present):
        for history, label in zip(histories, labels):
            steps, values = extract_series(history, metric)
            if steps:
                ax.plot(steps, moving_average(values, args.smooth), label=label, linewidth=1.2)
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(present) :]:
        ax.set_visible(False)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(args.output, dpi=100)
    plt.close(fig)
    print(f"wrote {args.output} ({len(present)} metrics, {len(args.runs)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
