"""What training the study's two main objectives on `digit_sort_long` (32-64 scored tokens) costs on a CPU, and what
learning signal its warm-up gives, measured on a few RL steps.

    python scripts/bench_length_train.py                 # measure, write docs/bench_length_train.json + docs block
    python scripts/bench_length_train.py --readme-only   # re-render the block of docs/length_noise.md from the JSON

The question: can sequence-level GRPO and StableDRL be compared on the long task over several seeds on a CPU, as
the stability study compares them on 5-token answers? Each objective (`OBJECTIVES`: grpo_seq and stable_drl of
`scripts/bench_stability.py`) is trained for `--steps` steps from the long task's SFT warm-up (the one
`scripts/bench_length_noise.py` uses, cached in `--sft-cache-dir`), with the stability study's settings (`STUDY`:
block_random, 2 MC samples, fresh masks, num_iterations 2, 8 completions x 4 prompts, lr 5e-5) on the long canvas
(`LONG`: 64 positions, 64 diffusion steps, 8 estimator blocks of 8: the official block count). Per objective it
records the wall time per step, the time a `--run-steps`-step run would take at that rate (held-out evaluations
not counted), and the learning signal of the rollouts: mean correctness and format rewards and the share of groups
whose rewards are all equal (they contribute nothing to either objective). The reading compares the projected run
with `--budget-seconds` (the largest run the study affords here): under it, the study's `--seeds` seeds are worth
running; over it, the cost is stated and the runs are left.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stabledrl_trl import results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JSON_NAME = "bench_length_train.json"
BLOCK = "length_train"
OBJECTIVES = ("grpo_seq", "stable_drl")
LONG = dict(max_completion_length=64, block_length=64, diffusion_steps=64, estimator_block_size=8)
LONG_SFT = dict(max_steps=160, learning_rate=1e-3, num_samples=5000, completion_length=64)  # bench_length_noise's


def load_study():
    """scripts/bench_stability.py as a module (its STUDY, OBJECTIVES and trainer builder)."""
    spec = importlib.util.spec_from_file_location("bench_stability", os.path.join(HERE, "bench_stability.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def signal(log_history: list[dict]) -> dict:
    """Means over the logged rollout steps of the rewards, the equal-reward group share and the completion length."""
    keys = {
        "correctness_mean": "rewards/digit_sort_correctness_reward/mean",
        "format_mean": "rewards/digit_sort_format_reward/mean",
        "equal_reward_group_frac": "frac_reward_zero_std",
        "completion_mean_length": "completions/mean_length",
    }
    out = {}
    for name, key in keys.items():
        values = [float(e[key]) for e in log_history if key in e]
        out[name] = sum(values) / len(values) if values else None
    return out


def projection(seconds_per_step: float, run_steps: int, seeds: int, objectives: int) -> dict:
    """Projected minutes of one run of `run_steps` steps and of the whole comparison (seeds x objectives runs)."""
    run = seconds_per_step * run_steps
    return {"projected_run_seconds": run, "projected_run_minutes": run / 60,
            "projected_study_minutes": run * seeds * objectives / 60}  # fmt: skip


def run(args, argv) -> dict:
    import torch

    from stabledrl_trl.sft import prepare_sft_model
    from stabledrl_trl.tasks import load_task_dataset

    bench = load_study()
    torch.set_num_threads(args.num_threads)
    provenance = results.provenance(__file__, argv)
    start = time.time()
    sft = {**LONG_SFT, "max_steps": args.sft_steps}
    model_path = prepare_sft_model(args.sft_cache_dir, task="digit_sort_long", seed=0, progress=False, **sft)
    sft_seconds = time.time() - start
    train_dataset = load_task_dataset("digit_sort_long", "train", seed=0)
    study = {**bench.STUDY, **LONG}
    out = {}
    for name in args.objectives:
        settings = bench.objective_settings(study, bench.OBJECTIVES[name], name)
        trainer = bench.make_trainer(settings, 0, model_path, os.path.join(args.runs_dir, name), args.steps,
                                     train_dataset)  # fmt: skip
        t0 = time.time()
        trainer.train()
        per_step = (time.time() - t0) / args.steps
        out[name] = {"seconds_per_step": per_step, **projection(per_step, args.run_steps, args.seeds,
                                                                len(args.objectives)),
                     **signal(trainer.state.log_history)}  # fmt: skip
        print(f"{name}: {per_step:.2f} s per step, {out[name]}", flush=True)
    return {
        "provenance": provenance,
        "settings": {
            "study": study,
            "objectives": list(args.objectives),
            "steps": args.steps,
            "run_steps": args.run_steps,
            "seeds": args.seeds,
            "prompts_per_step": bench.PROMPTS_PER_STEP,
            "budget_seconds": args.budget_seconds,
            "budget_minutes": args.budget_seconds / 60,
            "num_threads": args.num_threads,
            "sft": {**sft, "task": "digit_sort_long", "seed": 0},
        },  # fmt: skip
        "sft_seconds": sft_seconds,
        "objectives": out,
        "seconds": round(time.time() - start, 1),
    }


def reading(data: dict) -> list[str]:
    """The block's sentences, each with the figures it rests on."""
    s, o = data["settings"], data["objectives"]
    study = s["study"]
    steps = "; ".join(f"{n} {x['seconds_per_step']:.3g} s" for n, x in o.items())
    worst = max(o.values(), key=lambda x: x["projected_run_seconds"])
    over = worst["projected_run_seconds"] > s["budget_seconds"]
    lines = [
        f"One RL step on digit_sort_long ({study['max_completion_length']}-position canvas, "
        f"{study['diffusion_steps']} diffusion steps, {study['num_generations']} completions x "
        f"{s['prompts_per_step']} prompts, block_random in blocks of "
        f"{study['estimator_block_size']}, K = {study['mc_samples']}) took {steps} (mean of {s['steps']} steps, "
        f"{s['num_threads']} thread, on a CPU shared with other jobs).",
        f"A {s['run_steps']}-step run would take {worst['projected_run_minutes']:.3g} min without evaluations and the "
        f"comparison ({' and '.join(o)}, {s['seeds']} seeds each) {worst['projected_study_minutes']:.3g} min, "
        + (
            f"over the {s['budget_minutes']:g}-minute run this study affords, so the two objectives were not trained "
            f"on digit_sort_long."
            if over
            else f"within the {s['budget_minutes']:g}-minute run this study affords."
        ),
    ]
    for n, x in o.items():
        if x["equal_reward_group_frac"] is None:
            continue
        lines.append(
            f"{n}'s rollouts from the warm-up ({s['sft']['max_steps']} SFT steps): correctness reward "
            f"{x['correctness_mean']:.3f}, format reward {x['format_mean']:.3f} on average, "
            f"{x['equal_reward_group_frac']:.3f} of the groups with all rewards equal (no learning signal), mean "
            f"completion length {x['completion_mean_length']:.3g} tokens"
            + (
                ": every advantage is 0, so these rollouts give the objective no gradient at all (the warm-up, not "
                "the objective, is what limits RL on this task here)."
                if x["equal_reward_group_frac"] == 1.0
                else "."
            )
        )
    return lines


def render(data: dict) -> str:
    return (
        "\n".join(reading(data))
        + "\n\n"
        + f"Wall time {data['seconds'] / 60:.1f} min (SFT warm-up included). "
        + (results.provenance_line(data))
    )


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
    p.add_argument("--steps", type=int, default=4, help="RL steps timed per objective (default 4)")
    p.add_argument("--run-steps", type=int, default=300, help="steps of the run projected (the stability study's)")
    p.add_argument("--seeds", type=int, default=3, help="seeds of the comparison projected (default 3)")
    p.add_argument("--budget-seconds", type=float, default=120.0, help="largest affordable run (default 120 s)")
    p.add_argument("--sft-steps", type=int, default=LONG_SFT["max_steps"], help="long-task SFT warm-up steps")
    p.add_argument("--sft-cache-dir", default=".cache/stabledrl_tiny")
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--write-readme", action="store_true", help="write the docs block (default when writing docs/)")
    p.add_argument("--readme-only", action="store_true", help="run nothing: re-render the docs block from the JSON")
    return p


def parse_args(argv=None):
    args = make_parser().parse_args(argv)
    for name in ("steps", "run_steps", "seeds", "sft_steps", "num_threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)}: give an integer >= 1.")
    if args.budget_seconds <= 0:
        raise SystemExit(f"--budget-seconds {args.budget_seconds}: give a positive number of seconds.")
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
