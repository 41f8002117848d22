"""Noise-dose study: the objectives under estimator noise varied at known levels, trained until the best curve is
flat, with collapse defined, on the embedded digit-sorting task.

    python scripts/bench_noise_dose.py                                   # the full grid (many CPU hours; see below)
    python scripts/bench_noise_dose.py --preset dose-k-lr               # the named slice in docs/noise_dose.md
    python scripts/bench_noise_dose.py --preset long                    # 480 steps: its own JSON and block
    python scripts/bench_noise_dose.py --pilot --output-dir outputs/noise_dose_pilot   # a labelled short pilot
    python scripts/bench_noise_dose.py --readme-only                     # re-render docs/noise_dose.md

The dose. One estimator (the stability study's: block_random in blocks of 2, fresh masks where the objective allows
them) and two knobs: the Monte-Carlo samples K (`--mc-samples`, default 8 2 1: less to more estimator noise) and a
test-only noise of known standard deviation added to every log-ratio (`StableDRLConfig.test_log_ratio_noise_std`,
`--added-noise`, default 0 0.5 1 2; `stabledrl_trl.noise_dose`). Each cell is (K, added noise, learning rate); the
pure-noise log-ratio sd of every cell is measured at the start with the trainer's own scoring (`noise_sd` in the
JSON: the estimator's noise and the added noise together), so the dose is a number, not a label.

Objectives (`OBJECTIVES`): sequence-level GRPO (`grpo_seq`, the reference of the paired tests), StableDRL
(`stable_drl`), StableDRL without clipping (`stable_drl_no_clip`), DGPO (`dgpo`) and d1's diffu-GRPO (`diffu_grpo`;
its estimator is its own, so K does not change it, the added noise does). Learning rates: `--learning-rates`
(default 5e-5 1.5e-4). Seeds: `--seeds` (default 0-4).

Per run (`run_record`): the held-out accuracy curve (mean of `--eval-draws` sampled draws every `--eval-every` steps),
best, final and area under the curve (trapezoid over the evaluation steps, divided by the steps: the mean accuracy
over training), the distance the weights moved from the start (`param_distance`: L2 norm of the change, and relative
to the start's norm) so a faster learner is not mistaken for a more stable one, and whether it collapsed.

Collapse (`collapsed`): held-out accuracy below the start's minus `--collapse-margin` (default 0.02) for
`--collapse-evals` (default 3) evaluations in a row, or a non-finite grad norm. Saturation (`flat`): the best
objective's (highest mean AUC) mean curve (over seeds) rose by less than `--flat-delta` (default 0.01) over its last `--flat-evals`
(default 4) evaluations; a cell whose best curve is not flat is reported as "still rising", and its final accuracy
ranks learning speed, not stability.

Per cell (`cell_summary`): per objective the mean over seeds of best, final and AUC with 95% intervals, the number of
collapsed runs, the mean distance moved, and the paired t-test of final and AUC against grpo_seq (same seeds).
`breaking_point` names, for each learning rate, the smallest measured noise sd at which grpo_seq collapses in a
majority of seeds while stable_drl does not, or says that none was found in the grid. A collapse can be a dip the run
recovers from, so `breaking_point_persistent` is the same with only the collapsed runs that ended below the start
minus the margin counted (`collapsed_ended_below_start`).

`--summaries-only` trains nothing: it recomputes a study's summaries (cells, both breaking points, the rerun
comparison) from the per-run records in its JSON with the current definitions and records the command in
`summarized_by`, so a definition added after the runs were trained reaches a committed study without retraining it.

Cost: a 300-step run takes about 2 minutes on a free CPU core; the full grid (3 K x 4 noises x 2 learning rates x
5 objectives x 5 seeds = 600 runs of `--max-steps`, default 1500) is days of one core. Run it on a machine with
cores to spare (`--cells` picks a subset, e.g. `--cells 2:1.0:5e-5`). `--pilot` runs a labelled pilot (1 seed, 2
objectives, 2 doses, 60 steps): it checks the pipeline, it supports no conclusion. `--preset NAME` runs a named
partial grid (`PRESETS`; `k2-added-noise`: K = 2, added noise 0 / 0.5 / 1 / 2, every objective, 5 seeds, 120
steps; `dose-k-lr`: those cells plus K = 8 and K = 1 without added noise and lr 1.5e-4 at the added noise 0.5;
`long`: GRPO and StableDRL at K = 2, added noise 0 / 0.5 / 1, 480 steps, written to `bench_noise_dose_long.json`;
`long-all`: every objective at 480 steps at K = 2 with the added noise 0.5 / 1 / 2, written to
`bench_noise_dose_long_all.json`; `long-low-lr`: GRPO and StableDRL at 480 steps, lr 1.5e-5, added noise 0.5 / 1,
written to `bench_noise_dose_long_low_lr.json`),
whose block opens with the cells of the full grid it leaves out (`grid_label`, from the JSON's `grid`).

Resuming and splitting: every finished run is kept in its folder under `--runs-dir` (`noise_dose_run.json`, with
the settings it depends on) and reused by a later invocation with the same settings (the runs are deterministic on
one machine; on another machine rounding can differ, and `compare_reruns` records how far runs trained again agree).
So an interrupted study resumes, and a study can be split between processes by cells, each writing to a scratch
`--output-dir`, then written in full by one last invocation over the same `--runs-dir`:

    python scripts/bench_noise_dose.py --preset dose-k-lr --cells 8:0:5e-5 2:0:5e-5 2:2:5e-5 --output-dir /tmp/a &
    python scripts/bench_noise_dose.py --preset dose-k-lr --cells 1:0:5e-5 2:0.5:1.5e-4 2:0.5:5e-5 2:1:5e-5 \
        --output-dir /tmp/b
    python scripts/bench_noise_dose.py --preset dose-k-lr      # reuses the 175 runs, writes docs/
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stabledrl_trl import results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JSON_NAME = "bench_noise_dose.json"
BLOCK = "noise_dose"
OBJECTIVES = ("grpo_seq", "stable_drl", "stable_drl_no_clip", "dgpo", "diffu_grpo")
REFERENCE = "grpo_seq"
ALPHA = 0.05  # significance level of the paired t-tests in the reading
DEFAULTS = dict(mc_samples=[8, 2, 1], added_noise=[0.0, 0.5, 1.0, 2.0], learning_rates=[5e-5, 1.5e-4],
                seeds=[0, 1, 2, 3, 4], max_steps=1500, eval_every=50, eval_samples=512, eval_draws=4)  # fmt: skip
PILOT = dict(mc_samples=[2], added_noise=[0.0, 2.0], learning_rates=[5e-5], seeds=[0], max_steps=60, eval_every=20,
             eval_samples=128, eval_draws=2, objectives=["grpo_seq", "stable_drl"])  # fmt: skip
# Named partial grids: a slice of the full grid run in full (5 seeds), labelled as that slice with the cells it leaves
# out. "k2-added-noise": the grid's most informative slice on one CPU core (K = 2, the study's setting, with the
# added noise 0 / 0.5 / 1 / 2 as the dose; every objective; one learning rate). "dose-k-lr": that slice plus the
# estimator's own dose (K = 8 and K = 1, no added noise) and the second learning rate at the added noise 0.5, the
# lowest dose where GRPO collapsed (explicit `cells` instead of a product of the grid's axes). "long": GRPO and
# StableDRL at K = 2 with the added noise 0 / 0.5 / 1, four times as many steps (480), to see whether the curves
# flatten and whether StableDRL still holds where GRPO collapsed; written to its own JSON and block (`OUTPUTS`).
# "long-all": every objective at 480 steps at K = 2 with the added noise 0.5 (the long study's breaking cell), 1 and 2,
# so the objectives between GRPO and StableDRL (no clip, DGPO, diffu-GRPO) are read at the length where GRPO
# collapsed, and at the doses where DGPO and diffu-GRPO collapsed within 120 steps.
# "long-low-lr": GRPO and StableDRL over 480 steps at a third of the study's learning rate (1.5e-5, below the full
# grid's two) with the added noise 0.5 and 1, where GRPO collapsed at 5e-5: does a smaller step save GRPO?
PRESETS = {
    "k2-added-noise": dict(mc_samples=[2], added_noise=[0.0, 0.5, 1.0, 2.0], learning_rates=[5e-5], seeds=[0, 1, 2, 3, 4],
                           max_steps=120, eval_every=20, eval_samples=256, eval_draws=2,
                           objectives=["grpo_seq", "stable_drl", "stable_drl_no_clip", "dgpo", "diffu_grpo"]),
    "dose-k-lr": dict(cells=[(2, 0.0, 5e-5), (2, 0.5, 5e-5), (2, 1.0, 5e-5), (2, 2.0, 5e-5), (8, 0.0, 5e-5),
                             (1, 0.0, 5e-5), (2, 0.5, 1.5e-4)],
                      seeds=[0, 1, 2, 3, 4], max_steps=120, eval_every=20, eval_samples=256, eval_draws=2,
                      objectives=["grpo_seq", "stable_drl", "stable_drl_no_clip", "dgpo", "diffu_grpo"]),
    "long": dict(cells=[(2, 0.0, 5e-5), (2, 0.5, 5e-5), (2, 1.0, 5e-5)], seeds=[0, 1, 2, 3, 4], max_steps=480,
                 eval_every=20, eval_samples=256, eval_draws=2, objectives=["grpo_seq", "stable_drl"]),
    "long-all": dict(cells=[(2, 0.5, 5e-5), (2, 1.0, 5e-5), (2, 2.0, 5e-5)], seeds=[0, 1, 2, 3, 4], max_steps=480, eval_every=20, eval_samples=256,
                     eval_draws=2, objectives=["grpo_seq", "stable_drl", "stable_drl_no_clip", "dgpo", "diffu_grpo"]),
    "long-low-lr": dict(cells=[(2, 0.5, 1.5e-5), (2, 1.0, 1.5e-5)], seeds=[0, 1, 2, 3, 4], max_steps=480,
                        eval_every=20, eval_samples=256, eval_draws=2, objectives=["grpo_seq", "stable_drl"]),
}  # fmt: skip
# Where a study is written: (JSON file, docs block). A preset not listed writes the main study's.
OUTPUTS = {
    None: (JSON_NAME, BLOCK),
    "long": ("bench_noise_dose_long.json", "noise_dose_long"),
    "long-all": ("bench_noise_dose_long_all.json", "noise_dose_long_all"),
    "long-low-lr": ("bench_noise_dose_long_low_lr.json", "noise_dose_long_low_lr"),
}


def outputs(preset: str | None) -> tuple[str, str]:
    """(JSON file, docs block) of a study run with `preset` (the main study's for any preset without its own)."""
    return OUTPUTS.get(preset, OUTPUTS[None])


GRID_KEYS = ("mc_samples", "added_noise", "learning_rates")


def load_study():
    """scripts/bench_stability.py as a module: its settings, trainer, evaluation and statistics are reused."""
    spec = importlib.util.spec_from_file_location("bench_stability", os.path.join(HERE, "bench_stability.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --- the definitions: pure functions of the curves ----------------------------------------------------------------


def area_under_curve(accuracies: dict) -> float:
    """Mean accuracy over training: trapezoid of {step: accuracy} over the steps, divided by the step span."""
    steps = sorted(int(k) for k in accuracies)
    if len(steps) < 2:
        raise ValueError("area_under_curve needs at least two evaluations (before and after training).")
    values = [accuracies[str(s)] if str(s) in accuracies else accuracies[s] for s in steps]
    area = sum((b - a) * (u + v) / 2 for a, b, u, v in zip(steps, steps[1:], values, values[1:]))
    return area / (steps[-1] - steps[0])


def collapsed(accuracies: dict, grad_norms: list[float], margin: float, evals: int) -> bool:
    """Collapse: accuracy below (start - margin) for `evals` evaluations in a row, or a non-finite grad norm."""
    import math

    if any(not math.isfinite(g) for g in grad_norms):
        return True
    steps = sorted(int(k) for k in accuracies)
    values = [accuracies[str(s)] if str(s) in accuracies else accuracies[s] for s in steps]
    run = 0
    for v in values[1:]:
        run = run + 1 if v < values[0] - margin else 0
        if run >= evals:
            return True
    return False


def is_flat(curve: list[float], delta: float, evals: int) -> bool | None:
    """Saturation of a mean accuracy curve: it rose by less than `delta` over its last `evals` evaluations
    (max of the last `evals` values minus the value before them); None when the curve is too short to tell."""
    if len(curve) < evals + 1:
        return None
    return max(curve[-evals:]) - curve[-evals - 1] < delta


FLAT_LABELS = {True: "flat", False: "still rising", None: "too few evaluations to tell"}


def flat_state(records: list[dict], name: str, flat: dict) -> bool | None:
    """`is_flat` of objective `name`'s mean curve over its seeds (records of `run_record`)."""
    runs = [r for r in records if r["objective"] == name]
    steps = sorted(int(k) for k in runs[0]["accuracies"])
    curve = [sum(r["accuracies"][str(s)] for r in runs) / len(runs) for s in steps]
    return is_flat(curve, flat["delta"], flat["evals"])


def run_record(run: dict, margin: float, evals: int) -> dict:
    """Best, final, AUC, collapse and distance moved of one run summary (`bench_stability.train_one`)."""
    acc = run["accuracies"]
    return {
        "objective": run["objective"],
        "seed": run["seed"],
        "best": run["accuracy_best"],
        "final": run["accuracy_after"],
        "start": run["accuracy_before"],
        "auc": area_under_curve(acc),
        "collapsed": collapsed(acc, run["grad_norm"], margin, evals),
        "param_distance": run.get("param_distance"),
        "accuracies": acc,
        "seconds": run.get("seconds"),  # the run's training time (a kept run: when it was trained)
    }


def cell_summary(records: list[dict], flat_delta: float, flat_evals: int, margin: float = 0.02) -> dict:
    """Per objective: means over seeds with 95% intervals, collapsed runs and how many of them ended below the start
    - `margin` (a collapse can be a dip the run recovers from), distance moved, paired tests of final and AUC
    against REFERENCE; and whether the best objective's mean curve is flat."""
    out, curves = {}, {}
    names = list(dict.fromkeys(r["objective"] for r in records))
    for name in names:
        runs = [r for r in records if r["objective"] == name]
        entry = {"seeds": len(runs), "collapsed": sum(r["collapsed"] for r in runs),
                 "collapsed_ended_below_start": sum(r["collapsed"] and r["final"] < r["start"] - margin
                                                    for r in runs)}  # fmt: skip
        for key in ("best", "final", "auc"):
            values = [r[key] for r in runs]
            entry[key] = sum(values) / len(values)
            entry[f"{key}_ci95"] = results.mean_interval(values)
        distances = [r["param_distance"]["l2"] for r in runs if r.get("param_distance")]
        entry["param_distance"] = sum(distances) / len(distances) if distances else None
        if name != REFERENCE:
            ref = {r["seed"]: r for r in records if r["objective"] == REFERENCE}
            for key in ("final", "auc"):
                diffs = [r[key] - ref[r["seed"]][key] for r in runs if r["seed"] in ref]
                entry[f"{key}_vs_{REFERENCE}"] = results.paired_t_test(diffs) if len(diffs) >= 2 else None
        steps = sorted(int(k) for k in runs[0]["accuracies"])
        curves[name] = [sum(r["accuracies"][str(s)] for r in runs) / len(runs) for s in steps]
        out[name] = entry
    best = best_objective(out)
    return {"objectives": out, "best_objective": best, "flat": is_flat(curves[best], flat_delta, flat_evals)}


def best_objective(objectives: dict) -> str:
    """The objective with the highest mean area under the accuracy curve (the one whose saturation ends a study)."""
    return max(objectives, key=lambda n: objectives[n]["auc"])


# What a collapse count of the breaking point counts: every collapsed run, or only those that stayed down (collapsed
# and ended below the start - the collapse margin: a run that dipped and recovered is not counted).
COLLAPSE_COUNTS = ("collapsed", "collapsed_ended_below_start")


def breaking_point(cells: list[dict], count: str = "collapsed") -> dict:
    """Per learning rate, the smallest measured noise sd at which REFERENCE collapses in a majority of its seeds
    while stable_drl collapses in none; None when the grid has no such cell. `count` (one of COLLAPSE_COUNTS) says
    which runs count as collapsed: all of them, or only those that ended below the start - margin."""
    if count not in COLLAPSE_COUNTS:
        raise ValueError(f"count={count!r}: use one of {sorted(COLLAPSE_COUNTS)}")
    out = {}
    for lr in sorted({c["learning_rate"] for c in cells}):
        found = None
        for c in sorted((c for c in cells if c["learning_rate"] == lr), key=lambda c: c["noise_sd"]):
            o = c["summary"]["objectives"]
            if REFERENCE in o and "stable_drl" in o:
                if o[REFERENCE][count] * 2 > o[REFERENCE]["seeds"] and o["stable_drl"][count] == 0:
                    found = c["noise_sd"]
                    break
        out[f"{lr:g}"] = found
    return out


def study_summaries(data: dict) -> dict:
    """Every figure a study derives from its per-run records, with the current definitions: each cell's summary
    (`cell_summary`) and both breaking points (every collapse, and only the collapses that did not recover)."""
    s = data["settings"]
    for c in data["cells"]:
        c["summary"] = cell_summary(c["runs"], s["flat"]["delta"], s["flat"]["evals"], s["collapse"]["margin"])
    data["breaking_point"] = breaking_point(data["cells"])
    data["breaking_point_persistent"] = breaking_point(data["cells"], "collapsed_ended_below_start")
    return data


# --- running ------------------------------------------------------------------------------------------------------


RUN_FILE = "noise_dose_run.json"


def run_key(study: dict, objective: dict, seed: int, args) -> dict:
    """Everything a run's result depends on: a run finished in `--runs-dir` is reused only under the same key."""
    return {"study": study, "objective": objective, "seed": seed, "max_steps": args.max_steps,
            "eval_every": args.eval_every, "eval_samples": args.eval_samples, "eval_draws": args.eval_draws,
            "sft": load_study().SFT}  # fmt: skip


def read_cached_run(cell_dir: str, name: str, seed: int, key: dict):
    """(summary, before) of a finished run written by `write_cached_run` under the same key, else None."""
    path = os.path.join(cell_dir, f"{name}-seed{seed}", RUN_FILE)
    if not os.path.isfile(path):
        return None
    data = results.read_json(path)
    if data.get("key") != json.loads(json.dumps(key)):
        return None
    return data["summary"], data["before"]


def write_cached_run(cell_dir: str, name: str, seed: int, key: dict, summary: dict, before: dict):
    """Keep a finished run in its folder (so an interrupted or split study resumes: the runs are deterministic)
    and return (summary, before) as read back, so a fresh run and a reused one give the same objects."""
    path = os.path.join(cell_dir, f"{name}-seed{seed}", RUN_FILE)
    results.write_json(path, {"key": key, "summary": summary, "before": before})
    data = results.read_json(path)
    return data["summary"], data["before"]


def wall_time(data: dict) -> str:
    """The invocation's wall time, and (runs kept from earlier invocations) what training every run took in all."""
    text = f"Wall time {data['seconds'] / 60:.1f} min."
    runs = [r for cell in data.get("cells", []) for r in cell["runs"]]
    kept = sum(1 for r in runs if r.get("kept"))
    if kept:
        total = sum(r["seconds"] or 0.0 for r in runs) / 60
        text = (f"Wall time {data['seconds'] / 60:.1f} min for the last invocation, which reused {kept} of the "
                f"{len(runs)} runs from earlier ones over the same --runs-dir; training the {len(runs)} runs took "
                f"{total:.1f} min in all.")  # fmt: skip
    return text


def run(args, argv) -> dict:
    import torch

    from stabledrl_trl.sft import prepare_sft_model
    from stabledrl_trl.tasks import load_task_dataset

    bench = load_study()
    torch.set_num_threads(args.num_threads)
    provenance = results.provenance(__file__, argv)
    start = time.time()
    model_path = prepare_sft_model(args.sft_cache_dir, task="digit_sort", seed=0, progress=False, **bench.SFT)
    train_dataset = load_task_dataset("digit_sort", "train", seed=0)
    test_dataset = load_task_dataset("digit_sort", "test", num_samples=args.eval_samples, seed=0)
    noise_prompts = load_task_dataset("digit_sort", "test", num_samples=64, seed=0)["prompt"]
    table = {**bench.OBJECTIVES, **bench.EXTRA_OBJECTIVES}
    cells, before = [], None
    for k, added, lr in args.cells:
        overrides = {"test_log_ratio_noise_std": added}
        study = {**bench.STUDY, "mc_samples": k, "learning_rate": lr, **overrides}
        cell_args = SimpleNamespace(
            runs_dir=os.path.join(args.runs_dir, f"k{k}-noise{added:g}-lr{lr:g}"), max_steps=args.max_steps,
            eval_every=args.eval_every, eval_draws=args.eval_draws, regime={"mc_samples": k, "learning_rate": lr},
            overrides=overrides,
        )  # fmt: skip
        noise = bench.measure_noise(
            {"settings": {"study": study, "objectives": {n: table[n] for n in args.objectives}}},
            model_path, train_dataset, noise_prompts, cell_args.runs_dir, args.noise_pairs,
        )  # fmt: skip
        records = []
        for name in args.objectives:
            for seed in args.seeds:
                key = run_key(study, table[name], seed, args)
                cached = read_cached_run(cell_args.runs_dir, name, seed, key)
                if cached is None:
                    r, before = bench.train_one(name, table[name], seed, model_path, cell_args, train_dataset,
                                                test_dataset, before)  # fmt: skip
                    r, before = write_cached_run(cell_args.runs_dir, name, seed, key, r, before)
                else:
                    r, before = cached
                records.append({**run_record(r, args.collapse_margin, args.collapse_evals), "kept": cached is not None})
                kept = f", kept in {cell_args.runs_dir}" if cached is not None else ""
                print(f"K={k} noise={added:g} lr={lr:g} {name} seed {seed}: final {r['accuracy_after']:.3f} best "
                      f"{r['accuracy_best']:.3f} ({r['seconds']} s{kept})", flush=True)  # fmt: skip
        reference_noise = noise["objectives"].get(REFERENCE) or next(iter(noise["objectives"].values()))
        cells.append({
            "mc_samples": k, "added_noise_std": added, "learning_rate": lr,
            "noise_sd": reference_noise["log_ratio_sd"], "noise": noise, "runs": records,
        })  # fmt: skip
    return study_summaries({
        "provenance": provenance,
        "pilot": args.pilot,
        "preset": args.preset,
        "grid": grid_record(args),
        "settings": {
            "study": bench.STUDY,
            "objectives": args.objectives,
            "seeds": args.seeds,
            "max_steps": args.max_steps,
            "eval_every": args.eval_every,
            "eval_samples": args.eval_samples,
            "eval_draws": args.eval_draws,
            "collapse": {"margin": args.collapse_margin, "evals": args.collapse_evals},
            "flat": {"delta": args.flat_delta, "evals": args.flat_evals, "objective": "highest mean AUC"},
            "noise_pairs": args.noise_pairs,
        },  # fmt: skip
        "cells": cells,
        "seconds": round(time.time() - start, 1),
    })


def resummarize(data: dict, script: str, argv) -> dict:
    """A study's JSON with its summaries recomputed from its per-run records (`study_summaries`), for definitions
    added after its runs were trained; no run is trained and the records, noise and provenance are kept. The command
    that did it is recorded in `summarized_by` (rendered under the provenance line)."""
    data = study_summaries(data)
    data.pop("reruns", None)  # recomputed by main against the other committed studies
    data["summarized_by"] = {**results.git_state(), "command": results.command_line(script, argv)}
    return data


def grid_record(args) -> dict:
    """The grid that was run (its cells and objectives) next to the full grid (`DEFAULTS`, `OBJECTIVES`), so the
    rendering can name the cells of the full grid that were not run."""
    full = {key: list(DEFAULTS[key]) for key in GRID_KEYS}
    full.update(objectives=list(OBJECTIVES), seeds=list(DEFAULTS["seeds"]), max_steps=DEFAULTS["max_steps"])
    run_cells = [list(c) for c in args.cells]
    ran = {"mc_samples": sorted({c[0] for c in args.cells}, reverse=True),
           "added_noise": sorted({c[1] for c in args.cells}), "learning_rates": sorted({c[2] for c in args.cells}),
           "objectives": list(args.objectives)}  # fmt: skip
    return {"full": full, "cells": run_cells, "ran": ran}


def not_run(grid: dict) -> list[str]:
    """The parts of the full grid a run left out (each as "<what>: <values>"), from `grid_record`."""
    full, ran = grid["full"], grid["ran"]
    out = []
    for key, label in (("mc_samples", "K"), ("added_noise", "added noise"), ("learning_rates", "lr"),
                       ("objectives", "objectives")):  # fmt: skip
        missing = [v for v in full[key] if v not in ran[key]]
        if missing:
            out.append(f"{label} {', '.join(f'{v:g}' if isinstance(v, float) else str(v) for v in missing)}")
    all_cells = len(full["mc_samples"]) * len(full["added_noise"]) * len(full["learning_rates"])
    ran_product = len(ran["mc_samples"]) * len(ran["added_noise"]) * len(ran["learning_rates"])
    if len(grid["cells"]) < ran_product:
        out.append(f"{ran_product - len(grid['cells'])} of the remaining (K, noise, lr) combinations")
    in_grid = [c for c in grid["cells"] if c[0] in full["mc_samples"] and c[1] in full["added_noise"]
               and c[2] in full["learning_rates"]]  # fmt: skip
    out.append(f"{all_cells - len(in_grid)} of the full grid's {all_cells} (K, noise, lr) cells in all")
    return out


def outside_grid(grid: dict) -> list[str]:
    """The axis values a run used that the full grid does not have (each as "<what> <values>")."""
    full, ran = grid["full"], grid["ran"]
    out = []
    for key, label in (("mc_samples", "K"), ("added_noise", "added noise"), ("learning_rates", "lr")):
        extra = [v for v in ran[key] if v not in full[key]]
        if extra:
            out.append(f"{label} {', '.join(f'{v:g}' for v in extra)}")
    return out


def grid_label(data: dict) -> str:
    """The opening of the block: PILOT, a named partial grid with what it leaves out, or the full grid."""
    if data["pilot"]:
        return "PILOT (checks the pipeline; supports no conclusion). "
    grid = data.get("grid")
    if grid is None:
        return ""
    full, s = grid["full"], data["settings"]
    missing = not_run(grid)
    if len(missing) == 1 and list(s["objectives"]) == list(full["objectives"]) and s["max_steps"] >= full["max_steps"]:
        return "The full grid. "
    name = f" `{data['preset']}`" if data.get("preset") else ""
    ran = grid["ran"]
    if len(grid["cells"]) == len(ran["mc_samples"]) * len(ran["added_noise"]) * len(ran["learning_rates"]):
        cells = (f"the cells K = {', '.join(map(str, ran['mc_samples']))} x added noise "
                 f"{', '.join(f'{v:g}' for v in ran['added_noise'])} x lr "
                 f"{', '.join(f'{v:g}' for v in ran['learning_rates'])}")  # fmt: skip
    else:  # explicit cells, not a product of the axes: list them
        cells = "the (K, added noise, lr) cells " + ", ".join(f"({k}, {a:g}, {lr:g})" for k, a, lr in grid["cells"])
    outside = outside_grid(grid)
    if outside:
        cells += f" (beyond the full grid: {'; '.join(outside)})"
    return (
        f"PARTIAL GRID{name}: {cells}, objectives {', '.join(s['objectives'])}. "
        f"Not run from the full grid: {'; '.join(missing)}; and the full grid's {full['max_steps']} steps. "
    )


# --- rendering: from the JSON alone --------------------------------------------------------------------------------


def render(data: dict) -> str:
    s = data["settings"]
    label = grid_label(data)
    text = (
        f"{label}{s['max_steps']} steps, seeds {', '.join(str(x) for x in s['seeds'])}, held-out accuracy on "
        f"{s['eval_samples']} prompts (mean of {s['eval_draws']} draws) every {s['eval_every']} steps; collapse = "
        f"accuracy below the start - {s['collapse']['margin']:g} for {s['collapse']['evals']} evaluations in a row "
        f"or a non-finite grad norm. Noise sd: the pure-noise log-ratio sd of grpo_seq's setting at the start; its "
        f"own noise sd: the same for each objective with its own scoring (0 where it reuses its masks for both "
        f"policies).\n\n"
    )
    header = ["K", "added noise", "lr", "noise sd", "objective", "its own noise sd", "best", "final [95% CI]", "AUC",
              "collapsed", "distance moved (L2)", "final - grpo_seq (p)", "best curve flat"]  # fmt: skip
    rows = []
    for c in data["cells"]:
        summary = c["summary"]
        for name, o in summary["objectives"].items():
            ci = o["final_ci95"]
            test = o.get(f"final_vs_{REFERENCE}")
            own = c.get("noise", {}).get("objectives", {}).get(name, {}).get("log_ratio_sd")
            rows.append([
                c["mc_samples"], f"{c['added_noise_std']:g}", f"{c['learning_rate']:g}", f"{c['noise_sd']:.3f}", name,
                "-" if own is None else f"{own:.3f}",
                f"{o['best']:.3f}", f"{o['final']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""),
                f"{o['auc']:.3f}", f"{o['collapsed']} of {o['seeds']}",
                "-" if o["param_distance"] is None else f"{o['param_distance']:.3g}",
                "-" if not test else f"{test['mean']:+.3f} (p = {test['p']:.3f})",
                FLAT_LABELS[flat_state(c["runs"], name, s["flat"])] if name == best_objective(summary["objectives"]) else "",
            ])  # fmt: skip
    text += results.markdown_table(header, rows)
    text += "\n" + "\n".join(estimator_notes(data) + reading(data)) + "\n"
    text += f"\n{wall_time(data)} " + results.provenance_line(data)
    if "summarized_by" in data:
        by = data["summarized_by"]
        text += (f"Summaries recomputed from the runs' records by `{by['command']}` at commit "
                 f"{results.commit_label(by)}.\n")  # fmt: skip
    return text


def estimator_notes(data: dict) -> list[str]:
    """A sentence per objective whose scoring ignores the cell's K (from each cell's measured noise record), so that
    its identical rows across K read as what they are: the same runs, not a fault."""
    out = []
    names = list(data["cells"][0]["summary"]["objectives"]) if data["cells"] else []
    for name in names:
        records = [(c, c.get("noise", {}).get("objectives", {}).get(name)) for c in data["cells"]]
        records = [(c, r) for c, r in records if r]
        if len({c["mc_samples"] for c, _ in records}) < 2:
            continue
        own = {r.get("mc_samples") for _, r in records}
        if len(own) == 1:  # one K of its own while the cells' K vary: its scoring ignores the cell's K
            r = records[0][1]
            out.append(
                f"{name} scores with its own estimator ({r.get('likelihood_estimator')}, K = {own.pop()}) in every "
                "cell, whatever the cell's K: its runs do not depend on K, so its rows at the same added noise and "
                "learning rate are equal."
            )
    return out


def _significance(test: dict | None) -> str:
    if not test:
        return "no paired test"
    return f"p = {test['p']:.3f}, {'significant' if test['p'] < ALPHA else 'not significant'} at {ALPHA:g}"


def cell_reading(cell: dict, flat: dict) -> list[str]:
    """The reading of one cell, per objective against REFERENCE, each sentence with the figures it rests on: the
    paired final and AUC differences with their tests, the collapsed runs, the distance moved, and what the best
    curve's state (flat or still rising) lets the final accuracies say."""
    o = cell["summary"]["objectives"]
    if REFERENCE not in o:
        return []
    ref = o[REFERENCE]
    where = (
        f"At noise sd {cell['noise_sd']:.3f} (K = {cell['mc_samples']}, added noise {cell['added_noise_std']:g}, "
        f"lr {cell['learning_rate']:g})"
    )
    out = []
    for name, e in o.items():
        if name == REFERENCE:
            continue
        final, auc = e.get(f"final_vs_{REFERENCE}"), e.get(f"auc_vs_{REFERENCE}")
        if final is None or auc is None:
            continue
        moved = (
            f"; weights moved (L2) {e['param_distance']:.3g} against {ref['param_distance']:.3g}"
            if e["param_distance"] is not None and ref["param_distance"] is not None
            else ""
        )
        out.append(
            f"{where}, {name} - {REFERENCE}: final accuracy {final['mean']:+.3f} ({_significance(final)}), area under "
            f"the curve {auc['mean']:+.3f} ({_significance(auc)}); collapsed runs {name} {e['collapsed']} of "
            f"{e['seeds']}, {REFERENCE} {ref['collapsed']} of {ref['seeds']}{moved}."
        )
        ref_breaks, mine_breaks = ref["collapsed"] * 2 > ref["seeds"], e["collapsed"] * 2 > e["seeds"]
        if ref_breaks and e["collapsed"] == 0:
            out.append(
                f"There {REFERENCE}'s curve breaks ({ref['collapsed']} of {ref['seeds']} runs collapse) and {name}'s "
                f"does not (0 of {e['seeds']})."
            )
        elif ref_breaks or mine_breaks:
            out.append(
                f"There {REFERENCE} collapses in {ref['collapsed']} of {ref['seeds']} runs and {name} in "
                f"{e['collapsed']} of {e['seeds']}."
            )
    recovered = [(n, e) for n, e in o.items()
                 if "collapsed_ended_below_start" in e and e["collapsed_ended_below_start"] < e["collapsed"]]  # fmt: skip
    if recovered:
        out.append(
            f"{where}, collapsed runs that recovered (fell below the start - the collapse margin, then ended at or "
            "above it): "
            + "; ".join(f"{n} {e['collapsed'] - e['collapsed_ended_below_start']} of its {e['collapsed']}"
                        for n, e in recovered)  # fmt: skip
            + "."
        )
    best = cell["summary"]["best_objective"]
    state = flat_state(cell["runs"], best, flat)
    if state is False:
        out.append(
            f"{where}, the best curve ({best}, mean area under the curve {o[best]['auc']:.3f}) is still rising at the "
            f"last evaluation, so the final accuracies there rank how fast the objectives learn, not the level they "
            f"reach."
        )
    elif state is True:
        out.append(
            f"{where}, the best curve ({best}, mean area under the curve {o[best]['auc']:.3f}) is flat over its last "
            f"{flat['evals']} evaluations (rose by less than {flat['delta']:g})."
        )
    return out


def reading(data: dict) -> list[str]:
    """Every sentence of interpretation of the block (`cell_reading` of each cell, the breaking point), rendered
    from the JSON; tests/scripts/test_interpretation.py checks each against it (`stabledrl_trl.claims`)."""
    out = [x for c in data["cells"] for x in cell_reading(c, data["settings"]["flat"])]
    return out + breaking_point_sentences(data) + rerun_sentences(data)


def breaking_point_sentences(data: dict) -> list[str]:
    """A sentence per learning rate for `breaking_point`, and one for `breaking_point_persistent` (only the
    collapses that did not recover) where the JSON has it."""
    lines = []
    margin = data["settings"]["collapse"]["margin"]
    points = [("breaking_point", "collapsed", "")]
    if "breaking_point_persistent" in data:
        points.append(("breaking_point_persistent", "collapsed_ended_below_start",
                       f", counting only the collapsed runs that ended below the start - {margin:g}"))  # fmt: skip
    for key, count, qualifier in points:
        for lr, sd in data[key].items():
            cells = [c for c in data["cells"] if f"{c['learning_rate']:g}" == lr]
            if sd is None:
                sds = ", ".join(f"{c['noise_sd']:.3f}" for c in sorted(cells, key=lambda c: c["noise_sd"]))
                lines.append(
                    f"lr {lr}{qualifier}: at none of the measured noise sds ({sds}) does {REFERENCE} collapse in most "
                    f"seeds while stable_drl collapses in none."
                )
                continue
            cell = next(c for c in cells if c["noise_sd"] == sd)
            o = cell["summary"]["objectives"]
            lines.append(
                f"lr {lr}{qualifier}: smallest measured noise sd at which {REFERENCE} collapses in most seeds and "
                f"stable_drl in none: {sd:.3f} ({REFERENCE} {o[REFERENCE][count]} of {o[REFERENCE]['seeds']} seeds, "
                f"stable_drl {o['stable_drl'][count]} of {o['stable_drl']['seeds']})."
            )
    return lines


def shared_runs(data: dict, other: dict) -> list[tuple[dict, dict]]:
    """(run of `other`, run of `data`) pairs of the same cell (K, added noise, lr), objective and seed, when the two
    studies ran with the same study settings, steps and evaluation (so the pair is one run trained twice)."""
    keys = ("study", "max_steps", "eval_every", "eval_samples", "eval_draws")
    if any(data.get("settings", {}).get(k) != other.get("settings", {}).get(k) for k in keys):
        return []

    def runs(study):
        return {(c["mc_samples"], c["added_noise_std"], c["learning_rate"], r["objective"], r["seed"]): r
                for c in study.get("cells", []) for r in c["runs"]}  # fmt: skip

    mine, theirs = runs(data), runs(other)
    return [(theirs[k], mine[k]) for k in theirs if k in mine]


def compare_reruns(data: dict, others: dict[str, dict]) -> list[dict]:
    """For each other study sharing runs with `data` (`shared_runs`), how the runs trained again compare: how many
    start from and end at the same accuracy, and per objective the mean final accuracy and the collapsed runs in
    each. Stored in the study's JSON (`reruns`) when it is written, so the sentences are backed by it."""
    out = []
    for other in others.values():
        pairs = shared_runs(data, other)
        if not pairs:
            continue
        objectives = {}
        for name in dict.fromkeys(a["objective"] for a, _ in pairs):
            mine = [(a, b) for a, b in pairs if a["objective"] == name]
            k = len(mine)
            objectives[name] = {
                "runs": k,
                "final_there": sum(a["final"] for a, _ in mine) / k,
                "final_here": sum(b["final"] for _, b in mine) / k,
                "collapsed_there": sum(a["collapsed"] for a, _ in mine),
                "collapsed_here": sum(b["collapsed"] for _, b in mine),
            }
        out.append({
            "study": other.get("preset"), "commit": other.get("provenance", {}).get("commit"), "runs": len(pairs),
            "same_start": sum(a["start"] == b["start"] for a, b in pairs),
            "same_final": sum(a["final"] == b["final"] for a, b in pairs), "objectives": objectives,
        })  # fmt: skip
    return out


def rerun_sentences(data: dict) -> list[str]:
    """A sentence per entry of the study's `reruns` (`compare_reruns`)."""
    lines = []
    for r in data.get("reruns", []):
        n = r["runs"]
        parts = [
            f"{name} mean final {o['final_there']:.3f} there and {o['final_here']:.3f} here, collapsed "
            f"{o['collapsed_there']} and {o['collapsed_here']} of {o['runs']}"
            for name, o in r["objectives"].items()
        ]
        lines.append(
            f"{n} runs here train again runs of the `{r['study']}` study (same cell, objective, seed and settings): "
            f"{r['same_start']} of {n} start from the same accuracy and {r['same_final']} of {n} end at the same "
            f"final accuracy; {'; '.join(parts)}."
        )
    return lines


def committed_studies(docs_dir: str = results.DOCS) -> dict[str, dict]:
    """{docs block: its study's JSON} for each study of `OUTPUTS` whose JSON is in docs_dir."""
    paths = {block: os.path.join(docs_dir, name) for name, block in OUTPUTS.values()}
    return {block: results.read_json(path) for block, path in paths.items() if os.path.isfile(path)}


def interpretation_sentences(docs_dir: str = results.DOCS) -> list[tuple[str, list[dict]]]:
    """(sentence, [the JSON it is rendered from]) for every sentence of `reading` of the committed JSONs."""
    return [(x, [data]) for data in committed_studies(docs_dir).values() for x in reading(data)]


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{block: the docs block rendered from its JSON} for each study of `OUTPUTS` whose JSON is in docs_dir."""
    return {block: render(data) for block, data in committed_studies(docs_dir).items()}


# --- command line -------------------------------------------------------------------------------------------------


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", "--docs-dir", dest="output_dir", default=None, help="JSON folder (default docs/)")
    p.add_argument(
        "--page",
        default=None,
        help="page to write (default: the README.md or docs/*.md page holding the noise_dose markers)",
    )
    p.add_argument("--runs-dir", default="outputs/bench_noise_dose/runs")
    p.add_argument("--pilot", action="store_true", help="a labelled pilot: " + str(PILOT))
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="a named partial grid, labelled as such with the cells of the full grid it leaves out: "
        + "; ".join(f"{k}: {v}" for k, v in PRESETS.items()),
    )
    p.add_argument("--objectives", nargs="+", default=None, choices=OBJECTIVES)
    p.add_argument("--mc-samples", nargs="+", type=int, default=None)
    p.add_argument("--added-noise", nargs="+", type=float, default=None, help="test-only log-ratio noise std")
    p.add_argument("--learning-rates", nargs="+", type=float, default=None)
    p.add_argument("--cells", nargs="+", default=None, metavar="K:NOISE:LR", help="run only these cells")
    p.add_argument("--seeds", nargs="+", type=int, default=None)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--eval-samples", type=int, default=None)
    p.add_argument("--eval-draws", type=int, default=None)
    p.add_argument("--collapse-margin", type=float, default=0.02)
    p.add_argument("--collapse-evals", type=int, default=3)
    p.add_argument("--flat-delta", type=float, default=0.01)
    p.add_argument("--flat-evals", type=int, default=4)
    p.add_argument("--noise-pairs", type=int, default=512)
    p.add_argument("--sft-cache-dir", default=".cache/stabledrl_tiny")
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--readme-only", action="store_true", help="run nothing: re-render the docs page from the JSON")
    p.add_argument(
        "--summaries-only",
        action="store_true",
        help="train nothing: recompute the study's summaries (cells, breaking points, rerun comparison) from the "
        "per-run records in its JSON with the current definitions, and rewrite the JSON and its block",
    )
    return p


def parse_args(argv=None):
    args = make_parser().parse_args(argv)
    if args.pilot and args.preset:
        raise SystemExit("--pilot and --preset both choose the grid: give one of them.")
    if args.readme_only and args.summaries_only:
        raise SystemExit("--readme-only renders the JSON as it is, --summaries-only rewrites it: give one of them.")
    base = {**DEFAULTS, "objectives": list(OBJECTIVES), **(PILOT if args.pilot else PRESETS.get(args.preset, {}))}
    preset_cells = base.pop("cells", None)
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if preset_cells is not None and not args.cells:
        args.cells = [(k, float(a), float(lr)) for k, a, lr in preset_cells]
    elif args.cells:
        cells = []
        for item in args.cells:
            parts = item.split(":")
            if len(parts) != 3:
                raise SystemExit(f"--cells {item!r}: give K:NOISE:LR, e.g. 2:1.0:5e-5")
            try:
                cells.append((int(parts[0]), float(parts[1]), float(parts[2])))
            except ValueError:
                raise SystemExit(f"--cells {item!r}: K an integer, NOISE and LR numbers, e.g. 2:1.0:5e-5") from None
        args.cells = cells
    else:
        args.cells = [(k, a, lr) for lr in args.learning_rates for k in args.mc_samples for a in args.added_noise]
    for k, added, lr in args.cells:
        if k < 1 or added < 0 or lr <= 0:
            raise SystemExit(f"cell K={k}, noise={added}, lr={lr}: K >= 1, noise >= 0 and lr > 0 are required.")
    if REFERENCE not in args.objectives:
        raise SystemExit(f"--objectives must include {REFERENCE} (the paired tests are against it).")
    if args.collapse_evals < 1 or args.flat_evals < 1 or args.max_steps < args.eval_every or args.noise_pairs < 2:
        raise SystemExit("--collapse-evals and --flat-evals >= 1, --max-steps >= --eval-every, --noise-pairs >= 2.")
    if args.output_dir is None:
        args.output_dir = results.DOCS
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.readme_only:
        blocks = readme_blocks(args.output_dir)
        names = " or ".join(name for name, _ in OUTPUTS.values())
        results.rewrite_readme_only(blocks, args.output_dir, names, readme=args.page)
        return blocks
    json_name, block = outputs(args.preset)
    if args.summaries_only:
        path = os.path.join(args.output_dir, json_name)
        if not os.path.isfile(path):
            preset = f" --preset {args.preset}" if args.preset else ""
            raise SystemExit(f"--summaries-only: no {path} to recompute; run the study first "
                             f"(python scripts/bench_noise_dose.py{preset}).")  # fmt: skip
        data = resummarize(results.read_json(path), __file__, argv)
    else:
        data = run(args, argv)
    others = {b: d for b, d in committed_studies(args.output_dir).items() if b != block}
    reruns = compare_reruns(data, others)  # runs another committed study also trained
    if reruns:
        data["reruns"] = reruns
    results.write_json(os.path.join(args.output_dir, json_name), data)
    print(render(data))
    if args.page is not None or os.path.abspath(args.output_dir) == os.path.abspath(
        results.DOCS
    ):  # not for a scratch run
        results.write_readme_blocks({block: render(data)}, readme=args.page)
    return data


if __name__ == "__main__":
    main()
