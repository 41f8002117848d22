"""Stability study: the paper's GRPO baseline against d1's diffu-GRPO, DGPO, StableDRL's ratio form and StableDRL,
all fed noisy likelihood-ratio estimates, on the embedded digit-sorting task.

    python scripts/bench_stability.py                      # 5 objectives x 3 seeds, < 20 min on a 2-core CPU
    python scripts/bench_stability.py --quick              # 5 objectives x 1 seed, a few steps, < 3 min
    python scripts/bench_stability.py --objectives stable_drl grpo_token_fresh --seeds 0 1

Every run starts from the same SFT warm-up of the tiny LLaDA-architecture model (`configs/tiny.yaml`'s, cached in
`--sft-cache-dir` and shared with `scripts/train.py`), then trains with the settings of `STUDY` (block-random
estimator, 2 Monte-Carlo samples, num_iterations 2, a learning rate where GRPO misbehaves) and the objective's own
fields (`OBJECTIVES`). Only the RL seed differs between seeds. Held-out accuracy (test prompts never seen in
training, sampled at the training temperature) is measured before RL, every `--eval-every` steps and after RL.

Writes to `--output-dir`:
- `summary.json`: the settings, and per run (objective x seed) the max and median grad norm, spikes (steps whose
  grad norm is above 10x the run's median), the max unclipped importance weight, the mean clip fraction, held-out
  accuracy before / after / best, the reward curve and the grad-norm curve; plus per-objective means over seeds.
- `stability.png`: per objective (columns), grad norm on a log scale (top) and reward (bottom), seeds overlaid.
and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# Shared by every run: configs/tiny.yaml's rollout layout, with the noisy-ratio estimator of the official recipe.
STUDY = dict(
    likelihood_estimator="block_random",
    mc_samples=2,
    # one block on the 8-position canvas: a uniformly random count of the answer's tokens masked per sample, the
    # noisiest layout here (unclipped weights up to ~1e2); --set estimator_block_size=2 gives 4 blocks
    estimator_block_size=8,
    p_mask_prompt=0.0,  # masking prompt digits hides the input of a copy-and-sort task
    num_generations=8,
    max_completion_length=8,
    block_length=8,
    diffusion_steps=8,
    temperature=0.9,
    per_device_train_batch_size=32,
    gradient_accumulation_steps=1,
    num_iterations=2,
    learning_rate=1e-4,  # configs/tiny.yaml's; 2e-4 collapses even the mean-field default
    lr_scheduler_type="constant",
    max_grad_norm=1.0,
    beta=0.0,
)

# The objectives compared. Each states its ratio: a sequence-level log-weight L_theta - L_old (usable with fresh,
# independent masks) or per-token log-ratios (needing shared masks; see StableDRLConfig.allow_noisy_token_ratios).
OBJECTIVES = {
    # the paper's GRPO baseline: sequence-level ratio exp(L_theta - L_old), conditional clip, 1/G normalisation
    "grpo_seq": dict(loss_type="grpo", importance_sampling_level="sequence", mask_seed_mode="fresh"),
    # d1's diffu-GRPO: token-level GRPO on the one-step mean-field estimate, shared mask seeds, KL 0.04
    "diffu_grpo": dict(
        loss_type="grpo", likelihood_estimator="mean_field", mc_samples=1, mask_seed_mode="shared", beta=0.04
    ),
    # DGPO consumes per-token ratios: block-random masks shared between the old and the current policy
    "dgpo": dict(loss_type="dgpo", mask_seed_mode="shared"),
    # StableDRL's ratio form on the length-normalised sequence ratio, same fresh masks as stable_drl
    "stable_drl_ratio": dict(loss_type="stable_drl_ratio", stable_drl_ratio_form="mean", mask_seed_mode="fresh"),
    # the official StableDRL objective (C = 5, group softmax), fresh masks
    "stable_drl": dict(loss_type="stable_drl", clip_c=5.0, mask_seed_mode="fresh"),
}
# Not run by default: token-level GRPO on per-token ratios from fresh block-random masks (mask noise, refused by
# StableDRLConfig unless opted in); shows what the refusal prevents.
EXTRA_OBJECTIVES = {
    "grpo_token_fresh": dict(loss_type="grpo", mask_seed_mode="fresh", allow_noisy_token_ratios=True),
}

# The metrics giving the fraction of clipped samples (tokens), per loss type (summed).
CLIP_KEYS = {
    "stable_drl": ("stabledrl/clip_frac",),
    "stable_drl_ratio": ("stabledrl/clip_frac",),
    "dgpo": ("stabledrl/low_clip_frac", "stabledrl/high_clip_frac"),
    "grpo": ("clip_ratio/region_mean",),
}

SFT = dict(max_steps=200, learning_rate=1e-3, num_samples=5000, completion_length=8)  # configs/tiny.yaml's warm-up


def spikes(values: list[float], factor: float = 10.0) -> int:
    """Number of values above factor x their median (non-finite values count as spikes)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return len(values)
    median = statistics.median(finite)
    return sum(1 for v in values if not math.isfinite(v) or v > factor * median)


def run_summary(log_history: list[dict], loss_type: str, accuracies: dict[int, float], group_size: int = 8) -> dict:
    """Statistics of one run from TRL's per-step log history and held-out accuracies {step: accuracy}.

    accuracies must hold step 0 (before RL) and the last step (after RL). Every entry with a grad norm is a step;
    the reward curve has one point per generation (TRL logs the reward on the steps that generate). Returns max / median grad norm, spikes
    (steps above 10x the median grad norm), max unclipped weight, mean clip fraction, steps with some clipping,
    the smallest effective sample size and the steps where it is below group_size (self-normalised objectives
    only), accuracy before / after / best (over every evaluation), and the per-step reward and grad-norm curves.
    """
    steps = [h for h in log_history if "grad_norm" in h]  # every optimiser step (logging_steps=1)
    grad = [float(h["grad_norm"]) for h in steps]
    # rewards are logged on the steps that generate (every num_iterations-th step)
    reward = [float(h["reward"]) for h in steps if "reward" in h]
    keys = CLIP_KEYS.get(loss_type, ())
    clip = [sum(float(h[k]) for k in keys) for h in steps if keys and all(k in h for k in keys)]
    weights = [float(h["stabledrl/weight_max"]) for h in steps if "stabledrl/weight_max" in h]
    ess = [float(h["stabledrl/ess"]) for h in steps if "stabledrl/ess" in h]
    finite = [g for g in grad if math.isfinite(g)]
    order = sorted(accuracies)
    return {
        "steps": len(steps),
        "grad_norm_max": max(grad) if grad else float("nan"),
        "grad_norm_median": statistics.median(finite) if finite else float("nan"),
        "spikes": spikes(grad),
        "nonfinite_grad_norms": len(grad) - len(finite),
        "weight_max": max(weights) if weights else None,
        "clip_frac": sum(clip) / len(clip) if clip else None,
        "all_clipped_steps": sum(1 for c in clip if c >= 1.0 - 1e-6),
        "clipped_steps": sum(1 for c in clip if c > 0),
        "ess_min": min(ess) if ess else None,
        "ess_below_group_steps": sum(1 for e in ess if e < group_size - 1e-3) if ess else None,
        "accuracy_before": accuracies[order[0]],
        "accuracy_after": accuracies[order[-1]],
        "accuracy_best": max(accuracies.values()),
        "accuracies": {str(k): accuracies[k] for k in order},
        "reward": reward,
        "grad_norm": grad,
    }


def mean_over_seeds(runs: list[dict]) -> dict:
    """Per-objective means (and the spread of accuracy after RL) over its seeds."""

    def mean(key):
        values = [r[key] for r in runs if r[key] is not None]
        return sum(values) / len(values) if values else None

    after = [r["accuracy_after"] for r in runs]
    return {
        "seeds": len(runs),
        **{k: mean(k) for k in ("grad_norm_max", "grad_norm_median", "spikes", "weight_max", "clip_frac", "ess_min")},
        "grad_norm_max_max": max(r["grad_norm_max"] for r in runs),
        "accuracy_before": mean("accuracy_before"),
        "accuracy_after": mean("accuracy_after"),
        "accuracy_after_min": min(after),
        "accuracy_after_max": max(after),
        "accuracy_best": mean("accuracy_best"),
        "reward_last10": sum(sum(r["reward"][-10:]) / max(len(r["reward"][-10:]), 1) for r in runs) / len(runs),
    }


def train_one(name, fields, seed, model_path, args, train_dataset, test_dataset):
    """Train one objective with one seed; returns its summary."""
    from transformers import AutoTokenizer, TrainerCallback

    from stabledrl_trl import StableDRLConfig, StableDRLTrainer
    from stabledrl_trl.evaluation import evaluate_model
    from stabledrl_trl.tasks import get_task

    task = get_task("digit_sort")
    settings = {**STUDY, "learning_rate": args.learning_rate, **args.overrides, **fields}
    config = StableDRLConfig(
        output_dir=os.path.join(args.output_dir, "runs", f"{name}-seed{seed}"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        gradient_checkpointing=False,
        disable_tqdm=True,
        max_steps=args.max_steps,
        seed=seed,
        **settings,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    trainer = StableDRLTrainer(
        model=model_path,
        reward_funcs=list(task.reward_funcs),
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
    )
    accuracies: dict[int, float] = {}

    def evaluate(step):
        model = trainer.model
        was_training = model.training
        model.eval()
        result = evaluate_model(
            model, tokenizer, test_dataset, task,
            gen_length=config.max_completion_length, block_length=config.block_length, steps=config.diffusion_steps,
            temperature=config.temperature, batch_size=128, seed=1000, progress=False,
        )  # fmt: skip
        model.train(was_training)
        accuracies[step] = result["accuracy"]

    class HeldOut(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            if state.global_step % args.eval_every == 0 and state.global_step < args.max_steps:
                evaluate(state.global_step)

    trainer.add_callback(HeldOut())
    evaluate(0)
    start = time.time()
    trainer.train()
    evaluate(args.max_steps)
    summary = run_summary(trainer.state.log_history, config.loss_type, accuracies, config.num_generations)
    summary.update(objective=name, seed=seed, seconds=round(time.time() - start, 1))
    summary["settings"] = {k: v for k, v in settings.items()}
    summary["mask_seed_mode"] = config.mask_seed_mode
    return summary


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["objectives"])
    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names), 5.2), sharey="row", squeeze=False)
    for j, name in enumerate(names):
        runs = [r for r in summary["runs"] if r["objective"] == name]
        for r in runs:
            steps = range(1, len(r["grad_norm"]) + 1)
            grad = [g if math.isfinite(g) and g > 0 else float("nan") for g in r["grad_norm"]]
            axes[0, j].plot(steps, grad, lw=1, label=f"seed {r['seed']}")
            every = max(1, round(len(r["grad_norm"]) / max(len(r["reward"]), 1)))  # steps per generation
            axes[1, j].plot(
                range(1, every * len(r["reward"]) + 1, every), r["reward"], lw=1, label=f"seed {r['seed']}"
            )
        agg = summary["objectives"][name]
        axes[0, j].set_title(f"{name}\nacc {agg['accuracy_before']:.2f} -> {agg['accuracy_after']:.2f}", fontsize=9)
        axes[0, j].set_yscale("log")
        axes[1, j].set_xlabel("step")
    axes[0, 0].set_ylabel("grad norm (log)")
    axes[1, 0].set_ylabel("reward")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(summary: dict) -> None:
    header = (
        "| objective | grad norm max | grad norm median | spikes (>10x median) | max unclipped weight | clip frac | "
        "min ESS | held-out acc before | after (min-max) | best |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for name, a in summary["objectives"].items():

        def f(v, fmt="{:.3g}"):
            return "-" if v is None else fmt.format(v)

        print(
            f"| {name} | {f(a['grad_norm_max'])} | {f(a['grad_norm_median'])} | {f(a['spikes'], '{:.1f}')} | "
            f"{f(a['weight_max'])} | {f(a['clip_frac'], '{:.2f}')} | {f(a['ess_min'], '{:.2f}')} | "
            f"{a['accuracy_before']:.3f} | "
            f"{a['accuracy_after']:.3f} ({a['accuracy_after_min']:.3f}-{a['accuracy_after_max']:.3f}) | "
            f"{a['accuracy_best']:.3f} |"
        )


def parse_args(argv=None):
    all_names = list(OBJECTIVES) + list(EXTRA_OBJECTIVES)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", default="outputs/bench_stability")
    p.add_argument("--quick", action="store_true", help="1 seed, 10 steps, 128 held-out prompts (< 3 min)")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=all_names)
    p.add_argument("--seeds", nargs="+", type=int, default=None, help="RL seeds (default 0 1 2; --quick: 0)")
    p.add_argument("--max-steps", type=int, default=None, help="RL steps per run (default 60; --quick: 10)")
    p.add_argument("--eval-every", type=int, default=None, help="held-out evaluation period (default 20)")
    p.add_argument("--eval-samples", type=int, default=None, help="held-out prompts (default 512; --quick: 128)")
    p.add_argument("--learning-rate", type=float, default=STUDY["learning_rate"])
    p.add_argument(
        "--set", nargs="*", default=[], metavar="FIELD=VALUE",
        help="override a shared StableDRLConfig field of STUDY, e.g. --set estimator_block_size=8 mc_samples=4",
    )  # fmt: skip
    p.add_argument("--sft-cache-dir", default=".cache/stabledrl_tiny")
    p.add_argument("--sft-seed", type=int, default=0, help="seed of the shared SFT warm-up (configs/tiny.yaml: 0)")
    p.add_argument("--sft-steps", type=int, default=SFT["max_steps"], help="SFT warm-up steps (configs/tiny.yaml)")
    p.add_argument("--num-threads", type=int, default=1)
    args = p.parse_args(argv)
    args.overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in STUDY or key == "learning_rate":
            raise SystemExit(
                f"--set {item!r}: give FIELD=VALUE with FIELD one of {sorted(set(STUDY) - {'learning_rate'})}."
            )
        kind = type(STUDY[key])
        args.overrides[key] = (value.lower() in ("1", "true")) if kind is bool else kind(value)
    quick = args.quick
    args.seeds = args.seeds if args.seeds is not None else ([0] if quick else [0, 1, 2])
    args.max_steps = args.max_steps if args.max_steps is not None else (10 if quick else 60)
    args.eval_every = args.eval_every if args.eval_every is not None else (10**9 if quick else 20)
    args.eval_samples = args.eval_samples if args.eval_samples is not None else (128 if quick else 512)
    for name in ("max_steps", "eval_every", "eval_samples", "num_threads", "sft_steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1.")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from stabledrl_trl.sft import prepare_sft_model
    from stabledrl_trl.tasks import load_task_dataset

    torch.set_num_threads(args.num_threads)
    os.makedirs(args.output_dir, exist_ok=True)
    start = time.time()
    sft = {**SFT, "max_steps": args.sft_steps}
    model_path = prepare_sft_model(args.sft_cache_dir, task="digit_sort", seed=args.sft_seed, progress=False, **sft)
    train_dataset = load_task_dataset("digit_sort", "train", seed=0)
    test_dataset = load_task_dataset("digit_sort", "test", num_samples=args.eval_samples, seed=0)
    table = {**OBJECTIVES, **EXTRA_OBJECTIVES}
    runs = []
    for name in args.objectives:
        for seed in args.seeds:
            r = train_one(name, table[name], seed, model_path, args, train_dataset, test_dataset)
            runs.append(r)
            print(
                f"{name} seed {seed}: grad norm max {r['grad_norm_max']:.3g} median {r['grad_norm_median']:.3g} "
                f"spikes {r['spikes']}, accuracy {r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f} "
                f"(best {r['accuracy_best']:.3f}), {r['seconds']} s",
                flush=True,
            )
    summary = {
        "settings": {
            "study": {**STUDY, "learning_rate": args.learning_rate, **args.overrides},
            "objectives": {n: table[n] for n in args.objectives},
            "seeds": args.seeds,
            "max_steps": args.max_steps,
            "eval_every": args.eval_every,
            "eval_samples": len(test_dataset),
            "sft": {**sft, "seed": args.sft_seed},
            "quick": args.quick,
        },
        "objectives": {n: mean_over_seeds([r for r in runs if r["objective"] == n]) for n in args.objectives},
        "runs": runs,
        "seconds": round(time.time() - start, 1),
    }
    with open(os.path.join(args.output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(summary, os.path.join(args.output_dir, "stability.png"))
    print_table(summary)
    print(f"wrote {args.output_dir}/summary.json and stability.png in {summary['seconds']:.0f} s")
    return summary


if __name__ == "__main__":
    main()
