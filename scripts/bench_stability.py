"""Stability study: the paper's GRPO baseline against StableDRL on noisy likelihood ratios, with controls, on the
embedded digit-sorting task.

    python scripts/bench_stability.py --write-readme                # the study: 7 objectives x 5 seeds -> docs/
    python scripts/bench_stability.py --estimator coupled --tag coupled --write-readme   # with a low-variance estimator
    python scripts/bench_stability.py --objectives grpo_seq stable_drl --seeds 0 1 --max-steps 100
    python scripts/bench_stability.py --quick --output-dir /tmp/study   # 1 seed, a few steps: a smoke test

Every run starts from the same SFT warm-up of the tiny LLaDA-architecture model (`configs/tiny.yaml`'s, cached in
`--sft-cache-dir` and shared with `scripts/train.py`), then trains with the settings of `STUDY` (the official
estimator inputs: block-random masks, 2 Monte-Carlo samples, fresh masks, num_iterations 2) and the objective's own
fields (`OBJECTIVES`). Only the RL seed differs between seeds. Held-out accuracy (test prompts never seen in
training) is the mean over `--eval-draws` sampled evaluations at the training temperature (draw d seeded with
1000 + d, the same draws for every run), measured before RL, every `--eval-every` steps and after RL; greedy
accuracy before and after as well.

The claim tested: with noisy ratios StableDRL gains held-out accuracy while sequence-level GRPO gains less or loses.
Per seed, the paired difference of final accuracy (objective - grpo_seq; the same SFT start, so it is also the
difference of gains) is tested with a two-sided paired t-test and an exact sign test (`stabledrl_trl.results`).
Controls: GRPO on shared masks (less noise), GRPO with TRL's two-sided clip (`delta`, the bound StableDRL's C puts
on every weight, without self-normalisation), StableDRL with C = 1e6 (no clipping), DGPO and d1's diffu-GRPO.
Mechanism diagnostics (means over steps, where the trainer logs them): `stabledrl/weight_mean_neg_adv` and
`stabledrl/weight_mean_pos_adv` (the mean weight the objective applies to negative- and positive-advantage samples),
`stabledrl/equal_reward_group_frac`, `stabledrl/estimator_noise_std`, `stabledrl/log_ratio_std`.

Writes to `--output-dir` (default docs/; outputs/bench_stability with --quick):
- `bench_stability<_tag>_summary.json`: provenance (commit, command, package versions), the settings, per run
  (objective x seed) the statistics of `run_summary` with its accuracy curve and per-step grad norms, per objective
  the means over seeds, and the paired comparisons with grpo_seq.
- `stability<_tag>.png`: accuracy against step (mean over seeds, band min-max), the pre-clip grad norm (median over
  seeds) with the clipping threshold, each seed's paired difference, and the applied weights by advantage sign.
`--write-readme` rewrites the README block `stability<_tag>` from the JSON alone (`readme_blocks`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stabledrl_trl import results  # noqa: E402
from stabledrl_trl.cli_checks import parse_checked  # noqa: E402

# Shared by every run: configs/tiny.yaml's rollout layout with the official estimator inputs (configs/tiny_noisy.yaml).
STUDY = dict(
    likelihood_estimator="block_random",
    mc_samples=2,
    # blocks of 2 on the 8-position canvas: the 5-token answers span 3 blocks, so the official block choice applies
    estimator_block_size=2,
    p_mask_prompt=0.0,  # masking prompt digits hides the input of a copy-and-sort task
    num_generations=8,
    max_completion_length=8,
    block_length=8,
    diffusion_steps=8,
    temperature=0.9,
    per_device_train_batch_size=32,  # 4 prompts x num_generations
    gradient_accumulation_steps=1,
    num_iterations=2,
    learning_rate=5e-5,
    lr_scheduler_type="constant",
    max_grad_norm=1.0,
    beta=0.0,
)
PROMPTS_PER_STEP = 4
DEFAULT_STEPS = 300
DEFAULT_SEEDS = [0, 1, 2, 3, 4]
REFERENCE = "grpo_seq"  # paired differences are taken against this objective

# The objectives compared. Each states its ratio: a sequence-level log-weight L_theta - L_old (usable with fresh,
# independent masks) or per-token log-ratios (needing shared masks; see StableDRLConfig.allow_noisy_token_ratios).
OBJECTIVES = {
    # the paper's GRPO baseline: sequence-level ratio exp(L_theta - L_old), conditional clip, 1/G normalisation
    "grpo_seq": dict(loss_type="grpo", importance_sampling_level="sequence", mask_seed_mode="fresh"),
    # the official StableDRL objective (C = 5, group softmax), fresh masks
    "stable_drl": dict(loss_type="stable_drl", clip_c=5.0, mask_seed_mode="fresh"),
    # control: the same GRPO on masks shared by the old and current policy (the noise of L_theta - L_old cancels)
    "grpo_seq_shared": dict(loss_type="grpo", importance_sampling_level="sequence", mask_seed_mode="shared"),
    # control: TRL's two-sided clip (INTELLECT-2's delta) bounds every weight by StableDRL's C, no self-normalisation
    "grpo_seq_delta": dict(loss_type="grpo", importance_sampling_level="sequence", mask_seed_mode="fresh", delta=5.0),
    # control: StableDRL without clipping (self-normalisation alone)
    "stable_drl_no_clip": dict(loss_type="stable_drl", clip_c=1e6, mask_seed_mode="fresh"),
    # DGPO consumes per-token ratios: block-random masks shared between the old and the current policy
    "dgpo": dict(loss_type="dgpo", mask_seed_mode="shared"),
    # d1's diffu-GRPO: token-level GRPO on the one-step mean-field estimate, shared mask seeds, KL 0.04
    "diffu_grpo": dict(
        loss_type="grpo", likelihood_estimator="mean_field", mc_samples=1, mask_seed_mode="shared", beta=0.04
    ),  # fmt: skip
}
# Not run by default.
EXTRA_OBJECTIVES = {
    # StableDRL's ratio form on the length-normalised sequence ratio, same fresh masks as stable_drl
    "stable_drl_ratio": dict(loss_type="stable_drl_ratio", stable_drl_ratio_form="mean", mask_seed_mode="fresh"),
    # token-level GRPO on per-token ratios from fresh block-random masks (mask noise, refused by StableDRLConfig
    # unless opted in); shows what the refusal prevents
    "grpo_token_fresh": dict(loss_type="grpo", mask_seed_mode="fresh", allow_noisy_token_ratios=True),
}
# Objectives whose estimator is their own (not replaced by --estimator / --mc-samples).
OWN_ESTIMATOR = {"diffu_grpo"}

# The metrics giving the fraction of clipped samples (tokens), per loss type (summed).
CLIP_KEYS = {
    "stable_drl": ("stabledrl/clip_frac",),
    "stable_drl_ratio": ("stabledrl/clip_frac",),
    "dgpo": ("stabledrl/low_clip_frac", "stabledrl/high_clip_frac"),
    "grpo": ("clip_ratio/region_mean",),
}
# Per-step mechanism diagnostics averaged over steps when the trainer logs them.
DIAGNOSTICS = (
    "stabledrl/weight_mean_neg_adv",
    "stabledrl/weight_mean_pos_adv",
    "stabledrl/equal_reward_group_frac",
    "stabledrl/estimator_noise_std",
    "stabledrl/log_ratio_std",
)

SFT = dict(max_steps=200, learning_rate=1e-3, num_samples=5000, completion_length=8)  # configs/tiny.yaml's warm-up
EVAL_SEED = 1000


def spikes(values: list[float], factor: float = 10.0) -> int:
    """Number of values above factor x their median (non-finite values count as spikes)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return len(values)
    median = statistics.median(finite)
    return sum(1 for v in values if not math.isfinite(v) or v > factor * median)


def run_summary(
    log_history: list[dict],
    loss_type: str,
    accuracies: dict[int, float],
    group_size: int = 8,
    max_grad_norm: float | None = None,
) -> dict:
    """Statistics of one run from TRL's per-step log history and held-out accuracies {step: accuracy}.

    accuracies must hold step 0 (before RL) and the last step (after RL). Every entry with a grad norm is a step;
    the reward curve has one point per generation (TRL logs the reward on the steps that generate). Returns max /
    median grad norm (before clipping), spikes (steps above 10x the median grad norm), the steps whose grad norm
    exceeds max_grad_norm (clipped updates), max unclipped weight, mean clip fraction, steps with some clipping, the
    smallest effective sample size and the steps where it is below group_size (self-normalised objectives only),
    the means over steps of the `DIAGNOSTICS` logged, accuracy before / after / best (over every evaluation), and
    the per-step reward and grad-norm curves.
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
    diagnostics = {}
    for key in DIAGNOSTICS:
        values = [float(h[key]) for h in steps if key in h and math.isfinite(float(h[key]))]
        diagnostics[key.split("/", 1)[1]] = sum(values) / len(values) if values else None
    order = sorted(accuracies)
    return {
        "steps": len(steps),
        "grad_norm_max": max(grad) if grad else float("nan"),
        "grad_norm_median": statistics.median(finite) if finite else float("nan"),
        "spikes": spikes(grad),
        "nonfinite_grad_norms": len(grad) - len(finite),
        "grad_clipped_steps": None if max_grad_norm is None else sum(1 for g in grad if not g <= max_grad_norm),
        "weight_max": max(weights) if weights else None,
        "clip_frac": sum(clip) / len(clip) if clip else None,
        "all_clipped_steps": sum(1 for c in clip if c >= 1.0 - 1e-6),
        "clipped_steps": sum(1 for c in clip if c > 0),
        "ess_min": min(ess) if ess else None,
        "ess_below_group_steps": sum(1 for e in ess if e < group_size - 1e-3) if ess else None,
        "diagnostics": diagnostics,
        "accuracy_before": accuracies[order[0]],
        "accuracy_after": accuracies[order[-1]],
        "accuracy_best": max(accuracies.values()),
        "accuracies": {str(k): accuracies[k] for k in order},
        "reward": reward,
        "grad_norm": grad,
    }


def mean_over_seeds(runs: list[dict]) -> dict:
    """Per-objective means over its seeds, the spread of accuracy after RL and the gain's mean and std."""

    def mean(key):
        values = [r[key] for r in runs if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    after = [r["accuracy_after"] for r in runs]
    gains = [r["accuracy_after"] - r["accuracy_before"] for r in runs]
    gain_mean, gain_std = results.mean_std(gains)
    diagnostics = {}
    for key in runs[0].get("diagnostics", {}):
        values = [r["diagnostics"][key] for r in runs if r["diagnostics"].get(key) is not None]
        diagnostics[key] = sum(values) / len(values) if values else None
    return {
        "seeds": len(runs),
        **{
            k: mean(k)
            for k in (
                "grad_norm_max",
                "grad_norm_median",
                "spikes",
                "grad_clipped_steps",
                "weight_max",
                "clip_frac",
                "ess_min",
                "greedy_before",
                "greedy_after",
            )
        },  # fmt: skip
        "grad_norm_max_max": max(r["grad_norm_max"] for r in runs),
        "accuracy_before": mean("accuracy_before"),
        "accuracy_after": mean("accuracy_after"),
        "accuracy_after_min": min(after),
        "accuracy_after_max": max(after),
        "accuracy_best": mean("accuracy_best"),
        "gain": gain_mean,
        "gain_std": gain_std,
        "gain_ci95": results.mean_interval(gains),
        "diagnostics": diagnostics,
        "reward_last10": sum(sum(r["reward"][-10:]) / max(len(r["reward"][-10:]), 1) for r in runs) / len(runs),
    }


def paired_comparison(runs: list[dict], objective: str, reference: str = REFERENCE) -> dict | None:
    """Per seed, final accuracy of `objective` minus that of `reference`, with a paired t-test and a sign test.

    Only seeds run for both count; None when fewer than 2 such seeds.
    """
    by_seed = {r["seed"]: r for r in runs if r["objective"] == reference}
    pairs = [(r["seed"], r["accuracy_after"] - by_seed[r["seed"]]["accuracy_after"]) for r in runs
             if r["objective"] == objective and r["seed"] in by_seed]  # fmt: skip
    if len(pairs) < 2:
        return None
    differences = [d for _, d in pairs]
    return {
        "objective": objective,
        "reference": reference,
        "seeds": [s for s, _ in pairs],
        "differences": differences,
        "t_test": results.paired_t_test(differences),
        "sign_test": results.sign_test(differences),
    }


def config_fields() -> dict:
    """{name: default} of every StableDRLConfig field (for --set)."""
    from stabledrl_trl import StableDRLConfig

    return {f.name: f.default for f in dataclasses.fields(StableDRLConfig)}


def run_settings(fields: dict, name: str, args) -> dict:
    """The StableDRLConfig fields of one objective's runs: STUDY, the regime flags, --set, then the objective's."""
    settings = {**STUDY, **args.regime, **args.overrides}
    own = dict(fields)
    if name in OWN_ESTIMATOR:
        settings.pop("estimator_block_size", None)
    else:
        own.pop("likelihood_estimator", None)
    return {**settings, **own}


def train_one(name, fields, seed, model_path, args, train_dataset, test_dataset, before=None):
    """Train one objective with one seed; returns its summary. `before`: the accuracy record of the SFT model
    (the same for every run; measured here when None)."""
    from transformers import AutoTokenizer, TrainerCallback

    from stabledrl_trl import StableDRLConfig, StableDRLTrainer
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
    from stabledrl_trl.evaluation import evaluate_draws
    from stabledrl_trl.tasks import get_task

    task = get_task("digit_sort")
    settings = run_settings(fields, name, args)
    config = StableDRLConfig(
        output_dir=os.path.join(args.runs_dir, f"{name}-seed{seed}"),
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
    records: dict[int, dict] = {}

    def evaluate(step, greedy=False):
        model = trainer.model
        was_training = model.training
        model.eval()
        records[step] = evaluate_draws(
            model, tokenizer, test_dataset, task, draws=args.eval_draws, seed=EVAL_SEED, greedy=greedy,
            settings=SamplerSettings.from_config(config), batch_size=128, progress=False,
        )  # fmt: skip
        model.train(was_training)

    class HeldOut(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            if state.global_step % args.eval_every == 0 and state.global_step < args.max_steps:
                evaluate(state.global_step)

    trainer.add_callback(HeldOut())
    if before is None:
        evaluate(0, greedy=True)
    else:
        records[0] = before
    start = time.time()
    trainer.train()
    evaluate(args.max_steps, greedy=True)
    accuracies = {step: r["mean"] for step, r in records.items()}
    summary = run_summary(
        trainer.state.log_history, config.loss_type, accuracies, config.num_generations, config.max_grad_norm
    )
    summary.update(
        objective=name,
        seed=seed,
        seconds=round(time.time() - start, 1),
        accuracy_std={str(k): records[k]["std"] for k in sorted(records)},
        accuracy_draws={str(k): records[k]["draws"] for k in sorted(records)},
        greedy_before=records[0]["greedy"],
        greedy_after=records[args.max_steps]["greedy"],
        settings=settings,
        mask_seed_mode=config.mask_seed_mode,
    )
    return summary, records[0]


# --- figure and README block: from the summary alone --------------------------------------------------------------


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["objectives"])
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.4))
    ax = axes[0]  # accuracy against step: mean over seeds, band min-max
    for name in names:
        runs = [r for r in summary["runs"] if r["objective"] == name]
        steps = sorted(int(k) for k in runs[0]["accuracies"])
        table = [[r["accuracies"][str(s)] for r in runs] for s in steps]
        ax.plot(steps, [sum(v) / len(v) for v in table], color=colors[name], lw=1.5, label=name)
        ax.fill_between(steps, [min(v) for v in table], [max(v) for v in table], color=colors[name], alpha=0.15)
    ax.set(xlabel="step", ylabel="held-out accuracy (mean of draws)", title="accuracy: mean over seeds, band min-max")
    ax.legend(fontsize=7)
    ax = axes[1]  # pre-clip grad norm, median over seeds, with the threshold
    for name in names:
        runs = [r for r in summary["runs"] if r["objective"] == name]
        length = min(len(r["grad_norm"]) for r in runs)
        median = [statistics.median(r["grad_norm"][i] for r in runs) for i in range(length)]
        ax.plot(range(1, length + 1), [g if g > 0 and math.isfinite(g) else float("nan") for g in median],
                color=colors[name], lw=0.8, label=name)  # fmt: skip
    threshold = summary["settings"]["study"]["max_grad_norm"]
    ax.axhline(threshold, color="k", ls="--", lw=1, label=f"max_grad_norm {threshold:g}")
    ax.set(xlabel="step", ylabel="grad norm before clipping (log)", yscale="log", title="grad norm, median over seeds")
    ax.legend(fontsize=7)
    ax = axes[2]  # paired differences per seed against the reference
    comparisons = summary["comparisons"]
    for i, (name, c) in enumerate(comparisons.items()):
        ax.scatter([i] * len(c["differences"]), c["differences"], color=colors.get(name, "k"), s=18)
        ax.plot([i - 0.3, i + 0.3], [c["t_test"]["mean"]] * 2, color=colors.get(name, "k"), lw=2)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xlim(-0.6, max(len(comparisons), 1) - 0.4)
    ax.set_xticks(range(len(comparisons)), list(comparisons), rotation=30, ha="right", fontsize=7)
    ax.set(ylabel=f"final accuracy - {summary['reference']}", title="paired difference per seed (bar: mean)")
    ax = axes[3]  # the mechanism: applied weights by advantage sign
    diag = {n: summary["objectives"][n]["diagnostics"] for n in names}
    if any(d.get("weight_mean_neg_adv") is not None for d in diag.values()):
        xs = range(len(names))
        neg = [diag[n].get("weight_mean_neg_adv") or float("nan") for n in names]
        pos = [diag[n].get("weight_mean_pos_adv") or float("nan") for n in names]
        ax.bar([x - 0.2 for x in xs], neg, width=0.4, label="negative advantage")
        ax.bar([x + 0.2 for x in xs], pos, width=0.4, label="positive advantage")
        ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=7)
        ax.set(ylabel="mean applied weight", title="weights applied, by advantage sign")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "weight diagnostics not logged\nby this version", ha="center", va="center")
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _f(value, fmt: str = "{:.3g}") -> str:
    return "-" if value is None else fmt.format(value)


def _interval(ci) -> str:
    return "" if ci is None else f" [{ci[0]:+.3f}, {ci[1]:+.3f}]"


def render(summary: dict) -> str:
    """The README block of a study: settings, the table per objective, the paired tests, the provenance line."""
    s = summary["settings"]
    study = s["study"]
    text = (
        f"Settings: {study['likelihood_estimator']} estimator (estimator block {study.get('estimator_block_size')}, "
        f"{study['mc_samples']} MC samples), num_iterations {study['num_iterations']}, lr {study['learning_rate']:g}, "
        f"{s['max_steps']} steps, G = {study['num_generations']} x {PROMPTS_PER_STEP} prompts per step, "
        f"max_grad_norm {study['max_grad_norm']:g}; seeds {', '.join(str(x) for x in s['seeds'])}; held-out accuracy "
        f"on {s['eval_samples']} prompts, mean of {s['eval_draws']} draws at temperature {study['temperature']} "
        f"(greedy: temperature 0). Means over seeds:\n\n"
    )
    header = [
        "objective", "acc before", "acc after (min-max)", "gain +- std [95% CI]", "greedy before -> after",
        "grad norm max / median", "spikes per run", "steps clipped by max_grad_norm", "max unclipped weight",
        "clip frac", "min ESS", "weight on A<0 / A>0", "equal-reward groups",
    ]  # fmt: skip
    gains = {
        name: results.mean_interval(
            [r["accuracy_after"] - r["accuracy_before"] for r in summary["runs"] if r["objective"] == name]
        )
        for name in summary["objectives"]
    }
    rows = []
    for name, a in summary["objectives"].items():
        d = a["diagnostics"]
        weights = "-"
        if d.get("weight_mean_neg_adv") is not None:
            weights = f"{d['weight_mean_neg_adv']:.3f} / {_f(d.get('weight_mean_pos_adv'), '{:.3f}')}"
        rows.append([
            name,
            f"{a['accuracy_before']:.3f}",
            f"{a['accuracy_after']:.3f} ({a['accuracy_after_min']:.3f}-{a['accuracy_after_max']:.3f})",
            f"{a['gain']:+.3f} +- {a['gain_std']:.3f}" + _interval(gains[name]),
            f"{_f(a['greedy_before'], '{:.3f}')} -> {_f(a['greedy_after'], '{:.3f}')}",
            f"{a['grad_norm_max']:.3g} / {a['grad_norm_median']:.3g}",
            f"{a['spikes']:.1f}",
            _f(a["grad_clipped_steps"], "{:.1f}"),
            _f(a["weight_max"]),
            _f(a["clip_frac"], "{:.2f}"),
            _f(a["ess_min"], "{:.2f}"),
            weights,
            _f(d.get("equal_reward_group_frac"), "{:.2f}"),
        ])  # fmt: skip
    text += results.markdown_table(header, rows)
    comparisons = summary["comparisons"]
    if comparisons:
        text += f"\nPaired final differences against {summary['reference']} (per seed, same SFT start and seed):\n\n"
        rows = []
        for name, c in comparisons.items():
            t, sign = c["t_test"], c["sign_test"]
            rows.append([
                f"{name} - {c['reference']}",
                ", ".join(f"{x:+.3f}" for x in c["differences"]),
                f"{t['mean']:+.3f} +- {t['std']:.3f}",
                f"t = {t['t']:.2f}, df {t['df']}, p = {t['p']:.3f}",
                f"{sign['positive']} of {sign['positive'] + sign['negative'] + sign['zero']}, p = {sign['p']:.3f}",
            ])  # fmt: skip
        text += results.markdown_table(
            ["difference", "per seed", "mean +- std", "paired t-test (two-sided)", "seeds ahead, exact sign test"],
            rows,
        )
    text += verdict(summary)
    text += f"\nWall time {summary['seconds'] / 60:.1f} min. " + results.provenance_line(summary)
    return text


CLAIM_GAIN = 0.05  # the gain StableDRL should show (mean over seeds) for the claim to count as seen
CLAIM_P = 0.05  # significance level of the paired t-test


def verdict(summary: dict) -> str:
    """One sentence stating whether the run shows the claim, computed from the summary ("" without both runs)."""
    objectives, comparisons = summary["objectives"], summary["comparisons"]
    if "stable_drl" not in objectives or REFERENCE not in objectives or "stable_drl" not in comparisons:
        return ""
    sd, grpo = objectives["stable_drl"]["gain"], objectives[REFERENCE]["gain"]
    p = comparisons["stable_drl"]["t_test"]["p"]
    met = sd >= CLAIM_GAIN and grpo < sd and p < CLAIM_P
    return (
        f"\nThe claim (StableDRL gains at least {CLAIM_GAIN:+.2f} held-out accuracy on average while {REFERENCE} "
        f"gains less, paired difference significant at {CLAIM_P:g} by the paired t-test) is "
        f"{'seen' if met else 'not seen'} in this run: stable_drl {sd:+.3f}, {REFERENCE} {grpo:+.3f}, p = {p:.3f}.\n"
    )


def headline(summary: dict) -> str:
    """The README front page's summary of the default study: gains, the paired test and the grad norms ("" without
    both stable_drl and the reference)."""
    objectives, comparisons = summary["objectives"], summary["comparisons"]
    if "stable_drl" not in objectives or REFERENCE not in objectives or "stable_drl" not in comparisons:
        return ""
    sd, ref, c = objectives["stable_drl"], objectives[REFERENCE], comparisons["stable_drl"]
    t, sign = c["t_test"], c["sign_test"]
    seeds = sign["positive"] + sign["negative"] + sign["zero"]
    study = summary["settings"]["study"]
    return (
        f"On a tiny LLaDA-architecture model fed the official noisy estimator inputs ({study['likelihood_estimator']}, "
        f"{study['mc_samples']} MC samples, fresh masks, num_iterations {study['num_iterations']}), "
        f"{summary['settings']['max_steps']} steps, {seeds} seeds: held-out accuracy gain StableDRL "
        f"{sd['gain']:+.3f}, sequence-level GRPO {ref['gain']:+.3f} (from {ref['accuracy_before']:.3f}); paired "
        f"difference {t['mean']:+.3f} +- {t['std']:.3f}, t-test p = {t['p']:.3f}, {sign['positive']} of {seeds} "
        f"seeds ahead; largest pre-clip grad norm {sd['grad_norm_max']:.3g} against {ref['grad_norm_max']:.3g}. "
        f"{results.provenance_line(summary)}"
    )


def file_names(tag: str) -> tuple[str, str, str]:
    """(summary JSON, figure, README block name) of a study tag ("" for the default study)."""
    suffix = f"_{tag}" if tag else ""
    return f"bench_stability{suffix}_summary.json", f"stability{suffix}.png", f"stability{suffix}"


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{"stability<_tag>": rendered block} for every docs/bench_stability<_tag>_summary.json with provenance."""
    blocks = {}
    for entry in sorted(os.listdir(docs_dir)):
        if entry.startswith("bench_stability") and entry.endswith("_summary.json"):
            summary = results.read_json(os.path.join(docs_dir, entry))
            if "provenance" in summary:
                blocks[file_names(summary["settings"]["tag"])[2]] = render(summary)
                if not summary["settings"]["tag"] and headline(summary):
                    blocks["headline"] = headline(summary)
    coupled = os.path.join(docs_dir, file_names("coupled")[0])
    if "headline" in blocks and os.path.isfile(coupled):  # the same study on a low-variance estimator, if run
        blocks["headline"] += low_variance_sentence(results.read_json(coupled))
    return blocks


def low_variance_sentence(summary: dict) -> str:
    """The headline's second sentence: the study's result with a low-variance estimator ("" if incomplete)."""
    objectives, comparisons = summary["objectives"], summary["comparisons"]
    if "stable_drl" not in objectives or REFERENCE not in objectives or "stable_drl" not in comparisons:
        return ""
    t = comparisons["stable_drl"]["t_test"]
    if t["p"] >= CLAIM_P:
        reading = "no significant difference"
    elif t["mean"] > 0:
        reading = "StableDRL stays ahead"
    else:
        reading = "GRPO is ahead once the ratios are less noisy: StableDRL's gain here is specific to noisy ratios"
    return (
        f"With the low-variance {summary['settings']['study']['likelihood_estimator']} estimator (same quantity, "
        f"less noise) the same study gives StableDRL {objectives['stable_drl']['gain']:+.3f} and GRPO "
        f"{objectives[REFERENCE]['gain']:+.3f} (paired difference {t['mean']:+.3f}, p = {t['p']:.3f}): {reading}.\n"
    )


# --- command line -------------------------------------------------------------------------------------------------


def make_parser() -> argparse.ArgumentParser:
    from stabledrl_trl.stabledrl_config import ESTIMATOR_NAMES

    all_names = list(OBJECTIVES) + list(EXTRA_OBJECTIVES)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", default=None, help="summary and figure (default docs/; --quick: outputs/...)")
    p.add_argument("--runs-dir", default="outputs/bench_stability/runs", help="trainer output folders")
    p.add_argument("--tag", default="", help="suffix of the output files and README block, e.g. 'coupled'")
    p.add_argument("--quick", action="store_true", help="1 seed, 4 steps, 64 held-out prompts, 2 draws")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=all_names)
    p.add_argument("--seeds", nargs="+", type=int, default=None, help=f"RL seeds (default {DEFAULT_SEEDS})")
    p.add_argument("--max-steps", type=int, default=None, help=f"RL steps per run (default {DEFAULT_STEPS})")
    p.add_argument("--eval-every", type=int, default=None, help="held-out evaluation period (default max-steps/4)")
    p.add_argument("--eval-samples", type=int, default=None, help="held-out prompts (default 512)")
    p.add_argument("--eval-draws", type=int, default=None, help="sampled evaluations per point (default 4)")
    # the regime
    p.add_argument("--learning-rate", type=float, default=None, help=f"default {STUDY['learning_rate']:g}")
    p.add_argument("--num-generations", type=int, default=None, help="G (default 8); 4 prompts per step")
    p.add_argument("--mc-samples", type=int, default=None, help="Monte-Carlo samples per likelihood (default 2)")
    p.add_argument("--estimator", default=None, choices=ESTIMATOR_NAMES,
                   help="likelihood estimator of every objective but diffu_grpo (default block_random)")  # fmt: skip
    p.add_argument(
        "--set", nargs="*", default=[], metavar="FIELD=VALUE",
        help="override any StableDRLConfig field for every run, e.g. --set estimator_block_size=8 clip_c=3",
    )  # fmt: skip
    p.add_argument("--sft-cache-dir", default=".cache/stabledrl_tiny")
    p.add_argument("--sft-seed", type=int, default=0, help="seed of the shared SFT warm-up (configs/tiny.yaml: 0)")
    p.add_argument("--sft-steps", type=int, default=SFT["max_steps"], help="SFT warm-up steps (configs/tiny.yaml)")
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--write-readme", action="store_true", help="rewrite README.md's stability<_tag> block")
    p.add_argument(
        "--readme-only", action="store_true",
        help="run nothing: rewrite the stability blocks (README.md and docs/results.md) from the JSON files in --output-dir (default docs/)",
    )  # fmt: skip
    return p


def _parse_value(default, value: str):
    if isinstance(default, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise SystemExit(f"--set: {value!r} is not a boolean (true / false)")
        return value.lower() in ("true", "1")
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float) or default is None:
        try:
            return float(value) if default is not None or any(c in value for c in ".e") else int(value)
        except ValueError:
            return value if default is None else float(value)
    return value


def parse_args(argv=None):
    args = parse_checked(make_parser(), argv)
    fields = config_fields()
    args.overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"--set {item!r}: give FIELD=VALUE with FIELD a StableDRLConfig field.")
        if key in ("learning_rate", "num_generations", "mc_samples", "likelihood_estimator", "max_steps", "seed"):
            raise SystemExit(f"--set {key}: use its own flag (--learning-rate, --num-generations, --mc-samples, "
                             "--estimator, --max-steps, --seeds)")  # fmt: skip
        args.overrides[key] = _parse_value(fields[key], value)
    quick = args.quick
    args.regime = {}
    if args.learning_rate is not None:
        args.regime["learning_rate"] = args.learning_rate
    if args.num_generations is not None:
        args.regime["num_generations"] = args.num_generations
        args.regime["per_device_train_batch_size"] = PROMPTS_PER_STEP * args.num_generations
    if args.mc_samples is not None:
        args.regime["mc_samples"] = args.mc_samples
    if args.estimator is not None:
        args.regime["likelihood_estimator"] = args.estimator
    args.seeds = args.seeds if args.seeds is not None else ([0] if quick else DEFAULT_SEEDS)
    args.max_steps = args.max_steps if args.max_steps is not None else (4 if quick else DEFAULT_STEPS)
    args.eval_every = args.eval_every if args.eval_every is not None else max(1, args.max_steps // 4)
    args.eval_samples = args.eval_samples if args.eval_samples is not None else (64 if quick else 512)
    args.eval_draws = args.eval_draws if args.eval_draws is not None else (2 if quick else 4)
    for name in ("max_steps", "eval_every", "eval_samples", "eval_draws", "num_threads", "sft_steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1.")
    if args.output_dir is None:
        args.output_dir = "outputs/bench_stability" if quick else results.DOCS
    if quick and args.write_readme:
        raise SystemExit("--quick results are a smoke test: --write-readme refuses them (drop one of the two).")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.readme_only:
        blocks = readme_blocks(args.output_dir)
        results.rewrite_readme_only(blocks, args.output_dir, "bench_stability*_summary.json")
        return blocks
    if args.write_readme:
        results.check_readme_blocks([file_names(args.tag)[2]] + ([] if args.tag else ["headline"]))
    provenance = results.provenance(__file__, argv)  # the code as the runs start
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
    runs, before = [], None
    for name in args.objectives:
        for seed in args.seeds:
            r, before = train_one(name, table[name], seed, model_path, args, train_dataset, test_dataset, before)
            runs.append(r)
            print(
                f"{name} seed {seed}: grad norm max {r['grad_norm_max']:.3g} median {r['grad_norm_median']:.3g} "
                f"spikes {r['spikes']}, accuracy {r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f} "
                f"(best {r['accuracy_best']:.3f}), {r['seconds']} s",
                flush=True,
            )
    comparisons = {}
    if REFERENCE in args.objectives:
        for name in args.objectives:
            if name != REFERENCE and (c := paired_comparison(runs, name)) is not None:
                comparisons[name] = c
    summary = {
        "provenance": provenance,
        "settings": {
            "tag": args.tag,
            "study": {**STUDY, **args.regime, **args.overrides},
            "objectives": {n: table[n] for n in args.objectives},
            "seeds": args.seeds,
            "max_steps": args.max_steps,
            "eval_every": args.eval_every,
            "eval_samples": len(test_dataset),
            "eval_draws": args.eval_draws,
            "eval_seed": EVAL_SEED,
            "sft": {**sft, "seed": args.sft_seed},
            "quick": args.quick,
        },
        "reference": REFERENCE,
        "objectives": {n: mean_over_seeds([r for r in runs if r["objective"] == n]) for n in args.objectives},
        "comparisons": comparisons,
        "runs": runs,
        "seconds": round(time.time() - start, 1),
    }
    json_name, figure_name, block = file_names(args.tag)
    results.write_json(os.path.join(args.output_dir, json_name), summary)
    plot(summary, os.path.join(args.output_dir, figure_name))
    print(render(summary))
    print(f"wrote {args.output_dir}/{json_name} and {figure_name} in {summary['seconds']:.0f} s", flush=True)
    if args.write_readme:
        written = {block: render(summary)}
        if not args.tag and "headline" in readme_blocks(args.output_dir):  # the default study: the front page too
            written["headline"] = readme_blocks(args.output_dir)["headline"]
        results.write_readme_blocks(written)
        print(f"rewrote block {block}", flush=True)
    return summary


if __name__ == "__main__":
    main()
