"""Sequence-level GRPO and StableDRL trained on `digit_sort_long` (32-64 scored tokens per answer), several seeds:
the stability study's two main objectives on answers of realistic length.

    python scripts/bench_length_train.py                 # train, write docs/bench_length_train.json + docs block
    python scripts/bench_length_train.py --readme-only   # re-render the block of docs/length_noise.md from the JSON

Setting (`LONG`, on top of `scripts/bench_stability.py`'s `STUDY`): the 64-position canvas decoded in 32 diffusion
steps (two tokens a step, the official recipe's ratio of 256 tokens in 128 steps), block_random in the official 8
estimator blocks of 8, 2 MC samples, fresh masks, num_iterations 2, 8 completions x 4 prompts, lr 5e-5 constant.
Every run starts from one SFT warm-up of the long task (`LONG_SFT`, cached in `--sft-cache-dir`): longer than
`scripts/bench_length_noise.py`'s 160 steps, whose samples stopped after about 14 tokens and earned no reward.

Rewards: the task's own (`stabledrl_trl.tasks.digit_sort_long`): exact match 1.0, permutation 0.25, and the partial
reward, the longest common subsequence with the sorted digits over the longer length. Held-out score: the mean
partial reward on `--eval-samples` test prompts, mean of `--eval-draws` sampled draws (temperature 0.9), every
`--eval-every` steps (an exact match is too rare at this scale to rank the runs).

Per run: the held-out curve, best, final, area under the curve, collapse (`bench_noise_dose.collapsed`: below the
start - `--collapse-margin` for `--collapse-evals` evaluations in a row, or a non-finite grad norm), the L2 distance
the weights moved, the largest importance weight any step logged, and the means of the logged diagnostics. Per
objective: the pure-noise log-ratio spread and largest weight at the warm-up (theta = theta_old) with its own
scoring (`bench_stability.measure_noise`), the means over seeds with 95% intervals and the paired t-test against
grpo_seq (`bench_noise_dose.cell_summary`).

Every finished run is kept under `--runs-dir` with the settings it depends on (`bench_noise_dose.write_cached_run`)
and reused by a later invocation with the same settings (the runs are deterministic on one machine), so a study
resumes and can be split between processes by `--objectives` / `--seeds` (each with a scratch `--output-dir`), then
written in full by one last invocation.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stabledrl_trl import results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JSON_NAME = "bench_length_train.json"
BLOCK = "length_train"
TASK = "digit_sort_long"
OBJECTIVES = ("grpo_seq", "stable_drl")
REFERENCE = "grpo_seq"
ALPHA = 0.05
LONG = dict(max_completion_length=64, block_length=64, diffusion_steps=32, estimator_block_size=8)
LONG_SFT = dict(max_steps=800, learning_rate=1e-3, num_samples=5000, completion_length=64)


def load_script(name: str):
    """scripts/<name>.py as a module (the stability study's trainer and the dose study's definitions are reused)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_key(study: dict, objective: dict, seed: int, args) -> dict:
    """Everything a run's result depends on: a run kept in `--runs-dir` is reused only under the same key."""
    return {"task": TASK, "study": study, "objective": objective, "seed": seed, "max_steps": args.max_steps,
            "eval_every": args.eval_every, "eval_samples": args.eval_samples, "eval_draws": args.eval_draws,
            "sft": {**LONG_SFT, "max_steps": args.sft_steps}}  # fmt: skip


def objective_extras(runs: list[dict]) -> dict:
    """What the dose study's cell summary leaves out, over one objective's run summaries: the largest weight any
    step logged, and the means over runs of the logged diagnostics (None where no run logged them)."""
    weights = [r["weight_max"] for r in runs if r.get("weight_max") is not None]
    out = {"weight_max_in_training": max(weights) if weights else None}
    for key in ("estimator_noise_std", "log_ratio_std", "equal_reward_group_frac"):
        values = [r["diagnostics"][key] for r in runs if r["diagnostics"].get(key) is not None]
        out[key] = sum(values) / len(values) if values else None
    return out


def run(args, argv) -> dict:
    import torch

    from stabledrl_trl.sft import prepare_sft_model
    from stabledrl_trl.tasks import load_task_dataset
    from stabledrl_trl.tasks.digit_sort_long import digit_sort_long_partial_reward

    bench, dose = load_script("bench_stability"), load_script("bench_noise_dose")
    torch.set_num_threads(args.num_threads)
    provenance = results.provenance(__file__, argv)
    start = time.time()
    sft = {**LONG_SFT, "max_steps": args.sft_steps}
    model_path = prepare_sft_model(args.sft_cache_dir, task=TASK, seed=0, progress=False, **sft)
    train_dataset = load_task_dataset(TASK, "train", seed=0)
    test_dataset = load_task_dataset(TASK, "test", num_samples=args.eval_samples, seed=0)
    noise_prompts = test_dataset.select(range(min(len(test_dataset), args.noise_pairs // 8)))["prompt"]
    study = {**bench.STUDY, **LONG}
    table = {name: bench.OBJECTIVES[name] for name in args.objectives}
    noise = bench.measure_noise({"settings": {"study": study, "objectives": table}}, model_path, train_dataset,
                                noise_prompts, args.runs_dir, args.noise_pairs, task=TASK)  # fmt: skip
    run_args = SimpleNamespace(runs_dir=args.runs_dir, max_steps=args.max_steps, eval_every=args.eval_every,
                               eval_draws=args.eval_draws, regime=LONG, overrides={})  # fmt: skip
    runs, records, before = [], [], None
    for name in args.objectives:
        for seed in args.seeds:
            key = run_key(study, table[name], seed, args)
            kept = dose.read_cached_run(args.runs_dir, name, seed, key)
            if kept is None:
                r, before = bench.train_one(name, table[name], seed, model_path, run_args, train_dataset,
                                            test_dataset, before, task=TASK, metric=digit_sort_long_partial_reward)
                r, before = dose.write_cached_run(args.runs_dir, name, seed, key, r, before)
            else:
                r, before = kept
            runs.append(r)
            records.append({**dose.run_record(r, args.collapse_margin, args.collapse_evals), "kept": kept is not None})
            print(f"{name} seed {seed}: start {r['accuracy_before']:.3f} final {r['accuracy_after']:.3f} best "
                  f"{r['accuracy_best']:.3f} ({r['seconds']} s{', kept' if kept else ''})", flush=True)  # fmt: skip
    summary = dose.cell_summary(records, args.flat_delta, args.flat_evals, args.collapse_margin)
    for name, entry in summary["objectives"].items():
        entry.update(objective_extras([r for r in runs if r["objective"] == name]))
    return {
        "provenance": provenance,
        "settings": {
            "task": TASK,
            "study": study,
            "objectives": list(args.objectives),
            "seeds": args.seeds,
            "max_steps": args.max_steps,
            "eval_every": args.eval_every,
            "eval_samples": args.eval_samples,
            "eval_draws": args.eval_draws,
            "score": "held-out mean partial reward (LCS with the sorted digits / the longer length)",
            "collapse": {"margin": args.collapse_margin, "evals": args.collapse_evals},
            "flat": {"delta": args.flat_delta, "evals": args.flat_evals, "objective": "highest mean AUC"},
            "noise_pairs": args.noise_pairs,
            "num_threads": args.num_threads,
            "sft": {**sft, "task": TASK, "seed": 0},
        },
        "noise": noise,
        "runs": records,
        "summary": summary,
        "start_score": records[0]["start"],  # the warm-up's held-out score, the same for every run
        "greedy": {name: {"before": runs[0]["greedy_before"],
                          "after": sum(r["greedy_after"] for r in runs if r["objective"] == name)
                          / sum(1 for r in runs if r["objective"] == name)} for name in args.objectives},
        "seconds": round(time.time() - start, 1),
    }  # fmt: skip


# --- rendering ----------------------------------------------------------------------------------------------------


def _f(value, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def _test(test: dict | None) -> str:
    if not test:
        return "-"
    return f"{test['mean']:+.3f} (p = {test['p']:.3f})"


def table(data: dict) -> str:
    s, noise = data["summary"]["objectives"], data["noise"]["objectives"]
    rows = []
    for name, e in s.items():
        n = noise.get(name, {})
        ci = e["final_ci95"]
        rows.append([
            name, _f(n.get("log_ratio_sd")), _f(n.get("weight_max"), "{:.3g}"), _f(e["weight_max_in_training"], "{:.3g}"),
            _f(e["best"]), f"{e['final']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""), _f(e["auc"]),
            f"{e['collapsed']} of {e['seeds']}", _f(e["param_distance"], "{:.3g}"),
            _test(e.get(f"final_vs_{REFERENCE}")), _test(e.get(f"auc_vs_{REFERENCE}")),
        ])  # fmt: skip
    return results.markdown_table(
        ["objective", "pure-noise log-ratio sd at the start", "largest weight at the start",
         "largest weight in training", "best", "final [95% CI]", "AUC", "collapsed", "distance moved (L2)",
         f"final - {REFERENCE} (p)", f"AUC - {REFERENCE} (p)"], rows)  # fmt: skip


def reading(data: dict) -> list[str]:
    """The block's interpretation sentences, each with the figures it rests on."""
    s, o = data["settings"], data["summary"]["objectives"]
    noise = data["noise"]["objectives"]
    lines = []
    groups: dict[tuple, list[str]] = {}  # objectives scoring alike measure the same noise: one sentence for them
    for name, n in noise.items():
        groups.setdefault((n["log_ratio_sd"], n["weight_max"], n.get("scored_tokens_mean")), []).append(name)
    for (sd_, weight, tokens), names in groups.items():
        length = "" if tokens is None else f" ({tokens:.1f} scored tokens on average)"
        lines.append(
            f"At the warm-up, the pure-noise log-ratio of the model's own rollouts{length} scored as "
            f"{' and '.join(names)} score{'s' if len(names) == 1 else ''} has sd {sd_:.3f} and largest weight "
            f"{weight:.3g} ({data['noise']['pairs']} pairs); the largest weight any training step logged: "
            + ", ".join(f"{x} {_f(o[x]['weight_max_in_training'], '{:.3g}')}" for x in names)
            + "."
        )
    ref, sd = o.get(REFERENCE), o.get("stable_drl")
    if ref is not None and sd is not None:
        final, auc = sd.get(f"final_vs_{REFERENCE}"), sd.get(f"auc_vs_{REFERENCE}")
        line = (
            f"From a held-out score of {data['start_score']:.3f}, after {s['max_steps']} steps stable_drl ends at "
            f"{sd['final']:.3f} and {REFERENCE} at {ref['final']:.3f}"
        )
        if final and auc:
            sig = "significant" if final["p"] < ALPHA else "not significant"
            line += (
                f": stable_drl - {REFERENCE} final {final['mean']:+.3f} (p = {final['p']:.3f}, {sig} at "
                f"{ALPHA:g}), area under the curve {auc['mean']:+.3f} (p = {auc['p']:.3f})"
            )
        below = (
            f" (of them ended below the start - {s['collapse']['margin']:g}: stable_drl "
            f"{sd['collapsed_ended_below_start']}, {REFERENCE} {ref['collapsed_ended_below_start']})"
            if "collapsed_ended_below_start" in sd and "collapsed_ended_below_start" in ref
            else ""
        )
        lines.append(
            line + f"; collapsed runs stable_drl {sd['collapsed']} of {sd['seeds']}, {REFERENCE} {ref['collapsed']} "
            f"of {ref['seeds']}{below}; weights moved (L2) {_f(sd['param_distance'], '{:.3g}')} against "
            f"{_f(ref['param_distance'], '{:.3g}')}."
        )
    best = data["summary"]["best_objective"]
    state = {True: "flat over its last", False: "still rising over its last", None: "too short to tell over"}
    lines.append(
        f"The best curve ({best}, mean area under the curve {o[best]['auc']:.3f}) is "
        f"{state[data['summary']['flat']]} {s['flat']['evals']} evaluations (a rise under {s['flat']['delta']:g} "
        "counts as flat)"
        + (", so the final scores rank how fast the objectives learn, not the level they reach." if
           data["summary"]["flat"] is False else ".")  # fmt: skip
    )
    return lines


def render(data: dict) -> str:
    s = data["settings"]
    study = s["study"]
    head = (
        f"{', '.join(s['objectives'])} on {s['task']}, {s['max_steps']} RL steps, seeds "
        f"{', '.join(map(str, s['seeds']))}, from one SFT warm-up ({s['sft']['max_steps']} steps); "
        f"{study['max_completion_length']}-position canvas, {study['diffusion_steps']} diffusion steps, "
        f"{study['num_generations']} completions x "
        f"{study['per_device_train_batch_size'] // study['num_generations']} prompts, block_random in blocks of "
        f"{study['estimator_block_size']}, "
        f"K = {study['mc_samples']}, lr {study['learning_rate']:g}. Score: {s['score']} on {s['eval_samples']} test "
        f"prompts, mean of {s['eval_draws']} draws, every {s['eval_every']} steps; collapse = score below the start - "
        f"{s['collapse']['margin']:g} for {s['collapse']['evals']} evaluations in a row or a non-finite grad norm."
    )
    kept = sum(1 for r in data["runs"] if r.get("kept"))
    trained = sum(r["seconds"] or 0.0 for r in data["runs"]) / 60
    wall = f"Wall time {data['seconds'] / 60:.1f} min; training the {len(data['runs'])} runs took {trained:.1f} min"
    wall += f" ({kept} kept from earlier invocations over the same --runs-dir). " if kept else ". "
    return "\n".join([head, "", table(data).rstrip("\n"), "", *reading(data), "", wall + results.provenance_line(data)])


def interpretation_sentences(docs_dir: str = results.DOCS) -> list[tuple[str, list[dict]]]:
    path = os.path.join(docs_dir, JSON_NAME)
    if not os.path.isfile(path):
        return []
    data = results.read_json(path)
    return [(x, [data]) for x in reading(data)]


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{"length_train": the block rendered from docs_dir/bench_length_train.json} ({} without it)."""
    path = os.path.join(docs_dir, JSON_NAME)
    return {BLOCK: render(results.read_json(path))} if os.path.isfile(path) else {}


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", "--docs-dir", dest="output_dir", default=None, help="JSON folder (default docs/)")
    p.add_argument("--page", default=None, help="page to write (default: the page holding the length_train markers)")
    p.add_argument("--runs-dir", default="outputs/bench_length_train/runs")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=OBJECTIVES)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--max-steps", type=int, default=120, help="RL steps per run (default 120)")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--eval-samples", type=int, default=64, help="held-out prompts per evaluation (default 64)")
    p.add_argument("--eval-draws", type=int, default=2)
    p.add_argument("--collapse-margin", type=float, default=0.02)
    p.add_argument("--collapse-evals", type=int, default=3)
    p.add_argument("--flat-delta", type=float, default=0.01)
    p.add_argument("--flat-evals", type=int, default=3)
    p.add_argument("--noise-pairs", type=int, default=256, help="pure-noise pairs per objective (8 per prompt)")
    p.add_argument("--sft-steps", type=int, default=LONG_SFT["max_steps"], help="long-task SFT warm-up steps")
    p.add_argument("--sft-cache-dir", default=".cache/stabledrl_tiny")
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--write-readme", action="store_true", help="write the docs block (default when writing docs/)")
    p.add_argument("--readme-only", action="store_true", help="run nothing: re-render the docs block from the JSON")
    return p


def parse_args(argv=None):
    args = make_parser().parse_args(argv)
    for name in ("max_steps", "eval_every", "eval_samples", "eval_draws", "collapse_evals", "flat_evals",
                 "noise_pairs", "sft_steps", "num_threads"):  # fmt: skip
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)}: give an integer >= 1.")
    if args.max_steps % args.eval_every:
        raise SystemExit(f"--max-steps {args.max_steps} is not a multiple of --eval-every {args.eval_every}: the last "
                         "evaluation must fall on the last step.")  # fmt: skip
    if args.noise_pairs % 8:
        raise SystemExit(f"--noise-pairs {args.noise_pairs}: give a multiple of 8 (one pair per rollout, 8 a prompt).")
    if len(set(args.seeds)) != len(args.seeds):
        raise SystemExit(f"--seeds {args.seeds}: each seed once.")
    if args.output_dir is None:
        args.output_dir = results.DOCS
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.readme_only:
        blocks = readme_blocks(args.output_dir)
        results.rewrite_readme_only(blocks, args.output_dir, JSON_NAME, readme=args.page)
        return blocks
    data = run(args, argv)
    results.write_json(os.path.join(args.output_dir, JSON_NAME), data)
    print(render(data))
    if args.write_readme or args.page is not None or os.path.abspath(args.output_dir) == os.path.abspath(results.DOCS):
        results.write_readme_blocks({BLOCK: render(data)}, readme=args.page)
    return data


if __name__ == "__main__":
    main()
