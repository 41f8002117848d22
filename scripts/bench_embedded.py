"""The embedded defaults measured: held-out accuracy before and after RL of scripts/train.py's tiny configs, per seed.

    python scripts/bench_embedded.py --write-readme                        # tiny, tiny_noisy, tiny_block x seeds 0 1 2
    python scripts/bench_embedded.py --configs tiny_noisy --seeds 0 1 2 3
    python scripts/bench_embedded.py --quick --docs-dir /tmp/embedded      # a few steps: a smoke test
    python scripts/bench_embedded.py --configs tiny_gemma --write-readme   # DiffusionGemma: docs/diffusion_gemma.md
    python scripts/bench_embedded.py --configs tiny_code --write-readme    # the code task (bwrap): docs/code.md
    python scripts/bench_embedded.py --configs tiny_code_sort --seeds 0 1 2 3 4 --write-readme   # docs/code.md

Each (config, seed) runs scripts/train.py's pipeline in this process (`train.main`: SFT warm-up seeded with the seed
and cached, RL with the config's settings and seed), with held-out accuracy measured before and after RL as the mean
over `--eval-draws` sampled evaluations at the training temperature (draw d seeded with seed + d, the same draws
before and after) plus a greedy one. Per-step statistics of the importance weights come from the run's log history.

Writes `<docs-dir>/embedded_<config>.json` (provenance: commit, command, package versions; the settings; every run;
means over seeds) and, with `--write-readme`, the README blocks `embedded_<config>` rendered from those files only
(`readme_blocks`), each in the README.md or docs/*.md page holding its markers. A config whose YAML file is absent (e.g. configs/tiny_moe.yaml on a checkout without the tiny
MoE model) is skipped with a message.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stabledrl_trl import results  # noqa: E402
from stabledrl_trl.cli_checks import parse_checked  # noqa: E402

CONFIGS = ("tiny", "tiny_noisy", "tiny_block", "tiny_moe", "tiny_gemma", "tiny_code", "tiny_code_sort")
# Configs whose block ends with a conclusion rendered from the numbers (docs/code.md states the code tasks' there).
CONCLUDED = ("tiny_code", "tiny_code_sort")
SIGNIFICANCE = 0.05
DEFAULT_CONFIGS = ("tiny", "tiny_noisy", "tiny_block")
CONFIG_DIR = os.path.join(results.REPO_ROOT, "configs")
# --quick: seconds per run (a smoke test of the pipeline, not a measurement)
QUICK = dict(
    max_steps=2, sft_max_steps=5, sft_num_samples=64, num_eval_samples=16, eval_batch_size=16, num_train_samples=256
)


def config_path(name: str) -> str:
    return os.path.join(CONFIG_DIR, f"{name}.yaml")


def weight_statistics(log_history: list[dict], group_size: int) -> dict:
    """Per-step statistics of one run's importance weights and gradient, from TRL's log history.

    Every entry with a grad norm is an optimiser step (logging_steps 1). Returns the steps, the steps with an
    effective sample size below group_size and the smallest ESS (self-normalised objectives), the steps with some
    clipping (clip fraction > 0), the largest unclipped weight, the median over steps of the step's largest weight,
    and the largest (pre-clipping) grad norm; None where the metric is not logged.
    """
    steps = [h for h in log_history if "grad_norm" in h]
    ess = [float(h["stabledrl/ess"]) for h in steps if "stabledrl/ess" in h]
    clip = [float(h["stabledrl/clip_frac"]) for h in steps if "stabledrl/clip_frac" in h]
    weight = [float(h["stabledrl/weight_max"]) for h in steps if "stabledrl/weight_max" in h]
    grad = [float(h["grad_norm"]) for h in steps]
    return {
        "steps": len(steps),
        "ess_below_group_steps": sum(1 for e in ess if e < group_size - 1e-3) if ess else None,
        "ess_min": min(ess) if ess else None,
        "clipped_steps": sum(1 for c in clip if c > 0) if clip else None,
        "weight_max": max(weight) if weight else None,
        "weight_max_median": statistics.median(weight) if weight else None,
        "grad_norm_max": max(grad) if grad else None,
    }


def _accuracy(result: dict) -> dict:
    return {k: result[k] for k in ("mean", "std", "draws", "seeds", "greedy", "n", "temperature") if k in result}


def run_one(config: str, seed: int, args) -> dict:
    """scripts/train.py's pipeline for one config and seed; returns the run's record."""
    train = results_script("train")
    argv = [
        "--config", config_path(config), "--seed", str(seed),
        "--output_dir", os.path.join(args.runs_dir, f"{config}-seed{seed}"),
        "--sft_cache_dir", args.sft_cache_dir, "--logging_steps", "1", "--evaluate_before_after", "true",
        "--eval_draws", str(args.eval_draws), "--eval_greedy", "true", "--num_threads", str(args.num_threads),
    ]  # fmt: skip
    if args.quick:
        for key, value in QUICK.items():
            argv += [f"--{key}", str(value)]
    start = time.time()
    trainer, accuracy = train.main(argv=argv)
    seconds = time.time() - start
    before, after = _accuracy(accuracy["before"]), _accuracy(accuracy["after"])
    return {
        "seed": seed,
        "before": before,
        "after": after,
        "gain": after["mean"] - before["mean"],
        **weight_statistics(trainer.state.log_history, trainer.args.num_generations),
        "seconds": round(seconds, 1),
    }


_LOADED = {}


def results_script(name: str):
    """Import scripts/<name>.py as a module (scripts are not a package)."""
    import importlib.util

    if name not in _LOADED:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"scripts_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _LOADED[name] = module
    return _LOADED[name]


def summarise(config: str, runs: list[dict], args, provenance: dict) -> dict:
    import yaml

    with open(config_path(config)) as f:
        settings = yaml.safe_load(f)
    gains = [r["gain"] for r in runs]
    summary = {
        "provenance": provenance,
        "config": config,
        "config_file": f"configs/{config}.yaml",
        "settings": settings,
        "overrides": {**(QUICK if args.quick else {}), "eval_draws": args.eval_draws, "eval_greedy": True},
        "quick": args.quick,
        "seeds": [r["seed"] for r in runs],
        "runs": runs,
        "mean": {
            "before": statistics.fmean(r["before"]["mean"] for r in runs),
            "after": statistics.fmean(r["after"]["mean"] for r in runs),
            "gain": statistics.fmean(gains),
            "greedy_before": statistics.fmean(r["before"]["greedy"] for r in runs),
            "greedy_after": statistics.fmean(r["after"]["greedy"] for r in runs),
        },
        "gain_t_test": results.paired_t_test(gains) if len(gains) > 1 else None,
    }
    tuned = sorted(set(args.tuned_on_seeds or ()))
    if tuned:
        fresh = [r["gain"] for r in runs if r["seed"] not in tuned]
        summary["tuned_on"] = tuned
        summary["gain_t_test_fresh"] = results.paired_t_test(fresh) if len(fresh) > 1 else None
    return summary


# --- README rendering: from the JSON alone ------------------------------------------------------------------------


def _f(value, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def _significance(test: dict) -> str:
    """The reading of a paired t-test of the gain at the 5% level (two-sided), from its numbers."""
    if test["p"] < 0.05:
        return "a gain significant at the 5% level" if test["mean"] > 0 else "a loss significant at the 5% level"
    return "not significant at the 5% level"


def render(summary: dict) -> str:
    """The README block of one config: per seed, accuracy before / after RL (mean +- std over draws; greedy) and
    the gain, the weight statistics for configs whose weights are not 1, a mean row, and the provenance line."""
    runs = summary["runs"]
    draws = len(runs[0]["before"]["draws"])
    temperature = runs[0]["before"]["temperature"]
    noisy = (
        summary["settings"].get("likelihood_estimator") != "mean_field"
        or summary["settings"].get("num_iterations", 1) > 1
    )
    header = ["seed", "before RL", "after RL", "gain", "greedy before", "greedy after"]
    if noisy:
        header += [
            "steps with ESS < G", "min ESS", "steps with clipping", "max unclipped weight",
            "median per-step max weight", "max grad norm",
        ]  # fmt: skip
    rows = []
    for r in runs:
        row = [
            r["seed"],
            f"{r['before']['mean']:.3f} +- {r['before']['std']:.3f}",
            f"{r['after']['mean']:.3f} +- {r['after']['std']:.3f}",
            f"{r['gain']:+.3f}",
            _f(r["before"]["greedy"]),
            _f(r["after"]["greedy"]),
        ]
        if noisy:
            below = None if r["ess_below_group_steps"] is None else f"{r['ess_below_group_steps']}/{r['steps']}"
            clipped = None if r["clipped_steps"] is None else r["clipped_steps"]
            row += [
                _f(below, "{}"), _f(r["ess_min"], "{:.2f}"), _f(clipped, "{}"), _f(r["weight_max"], "{:.3g}"),
                _f(r["weight_max_median"], "{:.3g}"), _f(r["grad_norm_max"], "{:.3g}"),
            ]  # fmt: skip
        rows.append(row)
    m = summary["mean"]
    mean_row = ["mean", f"{m['before']:.3f}", f"{m['after']:.3f}", f"{m['gain']:+.3f}", _f(m["greedy_before"]),
                _f(m["greedy_after"])]  # fmt: skip
    rows.append(mean_row + [""] * (len(header) - len(mean_row)))
    text = results.markdown_table(header, rows)
    n = runs[0]["before"]["n"]
    text += (
        f"\nAccuracy on {n} held-out prompts: mean +- std over {draws} sampled draws at temperature {temperature} "
        "(the same draw seeds before and after), and greedy."
    )
    test = summary.get("gain_t_test")
    if test is not None:
        text += (
            f" Mean gain {test['mean']:+.3f} over {test['n']} seeds (paired t-test, after vs before: t = {test['t']:.2f}, "
            f"df {test['df']}, p = {test['p']:.3f}): {_significance(test)}."
        )
    if summary.get("tuned_on"):
        tuned = ", ".join(str(s) for s in summary["tuned_on"])
        fresh = summary.get("gain_t_test_fresh")
        text += f" The settings were chosen on seed{'s' if len(summary['tuned_on']) > 1 else ''} {tuned}"
        if fresh is not None:
            text += (
                f"; on the {fresh['n']} other seeds alone the mean gain is {fresh['mean']:+.3f} (t = {fresh['t']:.2f}, "
                f"df {fresh['df']}, p = {fresh['p']:.3f}): {_significance(fresh)}."
            )
        else:
            text += "."
    seconds = [r["seconds"] for r in runs]
    text += f" Wall time per run {min(seconds):.0f}-{max(seconds):.0f} s.\n"
    if summary["config"] in CONCLUDED:
        text += conclusion(summary) + "\n"
    return text + results.provenance_line(summary)


def conclusion(summary: dict) -> str:
    """One sentence on whether RL raised the held-out pass rate, from the seeds' gains and the paired t-test."""
    gains = [r["gain"] for r in summary["runs"]]
    up = sum(1 for g in gains if g > 0)
    test = summary.get("gain_t_test")
    seeds = f"the pass rate rose in {up} of {len(gains)} seeds"
    if test is None:
        return f"With one seed there is no test of the gain: {seeds}."
    if test["p"] < SIGNIFICANCE and test["mean"] > 0:
        return (f"RL raised the held-out pass rate: {seeds}, and the mean gain is significant "
                f"(p = {test['p']:.3f} < {SIGNIFICANCE}).")  # fmt: skip
    if test["p"] < SIGNIFICANCE:
        return f"RL lowered the held-out pass rate: {seeds}, and the mean loss is significant (p = {test['p']:.3f})."
    return (f"A gain of RL on this task is not established: {seeds}, and the mean gain is not significant "
            f"(p = {test['p']:.3f} >= {SIGNIFICANCE}).")  # fmt: skip


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{"embedded_<config>": rendered block} for every docs/embedded_<config>.json."""
    blocks = {}
    for config in CONFIGS:
        path = os.path.join(docs_dir, f"embedded_{config}.json")
        if os.path.isfile(path):
            blocks[f"embedded_{config}"] = render(results.read_json(path))
    return blocks


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), choices=CONFIGS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument(
        "--tuned-on-seeds", nargs="+", type=int, default=None,
        help="seeds whose results were used to choose the config's settings: the gain is also tested without them",
    )  # fmt: skip
    p.add_argument("--eval-draws", type=int, default=4, help="sampled evaluations before and after RL (>= 1)")
    p.add_argument("--docs-dir", default=results.DOCS, help="where embedded_<config>.json is written")
    p.add_argument("--runs-dir", default="outputs/bench_embedded", help="training outputs of each run")
    p.add_argument("--sft-cache-dir", default=".cache/stabledrl_tiny")
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2 RL steps, 5 SFT steps, 16 held-out prompts: a smoke test")
    p.add_argument("--write-readme", action="store_true", help="rewrite README.md's embedded_<config> blocks")
    p.add_argument(
        "--readme-only", action="store_true",
        help="run nothing: rewrite README.md's embedded_<config> blocks from the JSON files in --docs-dir",
    )  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parse_checked(make_parser(), argv)
    if args.readme_only:
        blocks = readme_blocks(args.docs_dir)
        results.rewrite_readme_only(blocks, args.docs_dir, "embedded_<config>.json")
        return blocks
    provenance = results.provenance(__file__, argv)  # the code as the runs start
    if args.eval_draws < 1:
        raise SystemExit(f"--eval-draws={args.eval_draws}: give at least 1 (4 or more to compare runs).")
    if args.tuned_on_seeds and not set(args.tuned_on_seeds) <= set(args.seeds):
        raise SystemExit(
            f"--tuned-on-seeds {args.tuned_on_seeds}: every seed there must also be in --seeds {args.seeds}."
        )
    if args.quick and args.write_readme:
        raise SystemExit("--quick results are a smoke test: --write-readme refuses them (drop one of the two).")
    if args.write_readme:
        for c in args.configs:
            if os.path.isfile(config_path(c)):
                results.check_readme_blocks([f"embedded_{c}"])
    written = {}
    for config in args.configs:
        if not os.path.isfile(config_path(config)):
            print(f"skipping {config}: configs/{config}.yaml does not exist in this checkout", flush=True)
            continue
        runs = []
        for seed in args.seeds:
            run = run_one(config, seed, args)
            print(
                f"{config} seed {seed}: {run['before']['mean']:.3f} -> {run['after']['mean']:.3f} "
                f"({run['gain']:+.3f}), {run['seconds']} s",
                flush=True,
            )
            runs.append(run)
        summary = summarise(config, runs, args, provenance)
        path = os.path.join(args.docs_dir, f"embedded_{config}.json")
        results.write_json(path, summary)
        print(render(summary))
        print(f"wrote {path}", flush=True)
        written[config] = summary
    if args.write_readme and written:
        blocks = readme_blocks(args.docs_dir)
        results.write_readme_blocks({f"embedded_{c}": blocks[f"embedded_{c}"] for c in written})
        print(f"rewrote the blocks: {', '.join(f'embedded_{c}' for c in written)}", flush=True)
    return written


if __name__ == "__main__":
    main()
