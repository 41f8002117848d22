"""Stability study: the paper's GRPO baseline against StableDRL on noisy likelihood ratios, with controls, on the
embedded digit-sorting task.

    python scripts/bench_stability.py --write-readme                # the study: 7 objectives x 5 seeds -> docs/
    python scripts/bench_stability.py --estimator block_random_coupled --tag coupled --write-readme   # another estimator
    python scripts/bench_stability.py --measure-noise --tag all     # add the estimator noise to every study JSON
    python scripts/bench_stability.py --objectives grpo_seq stable_drl --seeds 0 1 --max-steps 100
    python scripts/bench_stability.py --quick --output-dir /tmp/study   # 1 seed, a few steps: a smoke test

Every run starts from the same SFT warm-up of the tiny LLaDA-architecture model (`configs/tiny.yaml`'s, cached in
`--sft-cache-dir` and shared with `scripts/train.py`), then trains with the settings of `STUDY` (the official
estimator inputs: block-random masks, 2 Monte-Carlo samples, fresh masks, num_iterations 2) and the objective's own
fields (`OBJECTIVES`). Only the RL seed differs between seeds. Held-out accuracy (test prompts never seen in
training) is the mean over `--eval-draws` sampled evaluations at the training temperature (draw d seeded with
1000 + d, the same draws for every run), measured before RL, every `--eval-every` steps and after RL; greedy
accuracy before and after as well.

The estimator noise of every objective is measured in the study's own setting (`measure_noise`: at the SFT start,
theta = theta_old, the pure-noise sequence log-ratio and the largest weight with the trainer's own scoring,
`stabledrl_trl.estimator_noise`) and stored in the JSON; the readings in the README blocks (`verdict`,
`noise_sentence`, `comparison_sentences`, `headline`, `other_estimator_sentence`) are rendered from those figures.

The claim tested: with noisy ratios StableDRL gains held-out accuracy while sequence-level GRPO gains less or loses.
Per seed, the paired difference of final accuracy (objective - grpo_seq; the same SFT start, so it is also the
difference of gains) is tested with a two-sided paired t-test and an exact sign test (`stabledrl_trl.results`).
Controls: GRPO on shared masks (the same masks for the old and current policy), GRPO with TRL's two-sided clip (`delta`, the bound StableDRL's C puts
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
    return objective_settings({**STUDY, **args.regime, **args.overrides}, fields, name)


def objective_settings(study: dict, fields: dict, name: str) -> dict:
    """The study's shared settings with one objective's fields on top (an objective with its own estimator keeps it;
    the others take the study's)."""
    settings, own = dict(study), dict(fields)
    if name in OWN_ESTIMATOR:
        settings.pop("estimator_block_size", None)
    else:
        own.pop("likelihood_estimator", None)
    return {**settings, **own}


def make_trainer(settings: dict, seed: int, model_path: str, output_dir: str, max_steps: int, train_dataset,
                 task: str = "digit_sort"):  # fmt: skip
    """The StableDRLTrainer of one run: the study's CPU settings plus `settings` (`run_settings`), from the SFT start,
    rewarded by `task`'s reward functions."""
    from transformers import AutoTokenizer

    from stabledrl_trl import StableDRLConfig, StableDRLTrainer
    from stabledrl_trl.tasks import get_task

    config = StableDRLConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        gradient_checkpointing=False,
        disable_tqdm=True,
        max_steps=max_steps,
        seed=seed,
        **settings,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    return StableDRLTrainer(
        model=model_path,
        reward_funcs=list(get_task(task).reward_funcs),
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
    )


NOISE_PAIRS = 512  # pure-noise (old, current) pairs per objective: 64 prompts x G = 8 rollouts, one pair each
NOISE_SEED = 0


def measure_noise(summary: dict, model_path: str, train_dataset, prompts: list, runs_dir: str,
                  pairs: int = NOISE_PAIRS, task: str = "digit_sort") -> dict:  # fmt: skip
    """The estimator noise of each objective of a study in the study's own setting: for each objective, a trainer
    built with the run's exact settings (`summary["settings"]`) at the SFT start (theta = theta_old), its own
    rollouts of `prompts` and its own scoring (`stabledrl_trl.estimator_noise.measure_trainer_noise`). Returns
    {"model", "pairs", "objectives": {name: noise summary}}; shared masks give exactly 0."""
    from stabledrl_trl.estimator_noise import measure_trainer_noise

    study, table = summary["settings"]["study"], summary["settings"]["objectives"]
    out = {}
    for name, fields in table.items():
        settings = objective_settings(study, fields, name)
        trainer = make_trainer(settings, NOISE_SEED, model_path, os.path.join(runs_dir, f"noise-{name}"), 1,
                               train_dataset, task)  # fmt: skip
        clip_c = float(fields.get("clip_c", 5.0))
        out[name] = measure_trainer_noise(trainer, prompts, pairs=pairs, seed=NOISE_SEED, clip_c=clip_c)
        print(f"noise {name}: log-ratio sd {out[name]['log_ratio_sd']:.4f}, largest weight "
              f"{out[name]['weight_max']:.3g}", flush=True)  # fmt: skip
    return {
        "model": "the SFT warm-up every run starts from (theta = theta_old at the first step; the trained "
        "checkpoints are not kept, so the noise later in training is not measured)",
        "pairs": pairs,
        "rollout_seed": NOISE_SEED,
        "objectives": out,
    }


def train_one(name, fields, seed, model_path, args, train_dataset, test_dataset, before=None, task="digit_sort",
              metric=None):  # fmt: skip
    """Train one objective with one seed; returns its summary. `before`: the accuracy record of the SFT model
    (the same for every run; measured here when None). `task`: the task whose rewards train; `metric`: the reward
    function whose held-out mean is the accuracy (None: the task's correctness reward)."""
    from transformers import TrainerCallback

    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
    from stabledrl_trl.evaluation import evaluate_draws
    from stabledrl_trl.tasks import get_task

    graded = metric if metric is not None else get_task(task)
    settings = run_settings(fields, name, args)
    trainer = make_trainer(
        settings, seed, model_path, os.path.join(args.runs_dir, f"{name}-seed{seed}"), args.max_steps, train_dataset,
        task,
    )
    config, tokenizer = trainer.args, trainer.processing_class
    records: dict[int, dict] = {}

    def evaluate(step, greedy=False):
        model = trainer.model
        was_training = model.training
        model.eval()
        records[step] = evaluate_draws(
            model, tokenizer, test_dataset, graded, draws=args.eval_draws, seed=EVAL_SEED, greedy=greedy,
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
    start_params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}  # the SFT start
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
        param_distance=parameter_distance(trainer.model, start_params),
    )
    return summary, records[0]


def parameter_distance(model, start: dict) -> dict:
    """How far training moved the weights from `start` ({name: tensor}): the L2 norm of the change over every
    parameter, and that norm relative to the L2 norm of the start weights."""
    import torch

    change = sum(float(torch.sum((p.detach() - start[n]) ** 2)) for n, p in model.named_parameters())
    norm = sum(float(torch.sum(t**2)) for t in start.values())
    return {"l2": change**0.5, "relative": (change / norm) ** 0.5 if norm > 0 else None}


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
    text += ending_sentence(summary)
    text += noise_sentence(summary)
    text += comparison_sentences(summary)
    text += f"\nWall time {summary['seconds'] / 60:.1f} min. " + results.provenance_line(summary)
    if summary.get("estimator_noise", {}).get("provenance"):
        text += "Estimator noise: " + results.provenance_line(summary["estimator_noise"])
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


def noise_of(summary: dict, name: str) -> dict | None:
    """The estimator noise measured for objective `name` in the study's own setting (None if not measured)."""
    return (summary.get("estimator_noise") or {}).get("objectives", {}).get(name)


def noise_sentence(summary: dict) -> str:
    """The estimator noise of the study's setting, per objective, as measured (`measure_noise`; "" if not)."""
    record = summary.get("estimator_noise")
    if not record:
        return ""
    parts = []
    for name in summary["objectives"]:
        n = noise_of(summary, name)
        if n is not None:
            parts.append(
                f"{name} sd {n['log_ratio_sd']:.3f}, largest weight {n['weight_max']:.3g}"
                + (f", {n['frac_above_clip_c']:.3f} above C = {n['clip_c']:g}" if n["log_ratio_sd"] > 0 else "")
            )
    first = next(iter(record["objectives"].values()))
    return (
        f"\nEstimator noise in this setting, measured at the SFT start (theta = theta_old) with the trainer's own "
        f"scoring, {record['pairs']} pairs of the old and the current estimate of one rollout "
        f"({first['scored_tokens_mean']:.2f} scored tokens on average): pure-noise sequence log-ratio {'; '.join(parts)} "
        f"(measured at the start only: the trained checkpoints are not kept; the table's max unclipped weight is the "
        f"largest seen during training).\n"
    )


def ending_sentence(summary: dict) -> str:
    """How the runs end: per objective the mean over seeds of each run's best held-out accuracy against its final one
    (equal only when every seed ended at its best evaluation), and the fixed step budget it rests on."""
    parts = [
        f"{name} {a['accuracy_best']:.3f} / {a['accuracy_after']:.3f}" for name, a in summary["objectives"].items()
    ]
    at_best = [name for name, a in summary["objectives"].items() if a["accuracy_best"] - a["accuracy_after"] < 5e-4]
    steps = summary["settings"]["max_steps"]
    return (
        f"\nBest / final held-out accuracy (means over seeds of each run's best and last evaluation): "
        f"{'; '.join(parts)}; {len(at_best)} of {len(parts)} objectives ended every seed at its best evaluation. "
        f"Every run stops after a fixed {steps} steps with no saturation criterion, so the final accuracies compare "
        f"what each objective reaches in {steps} steps, not the level it saturates at nor its resistance to "
        f"collapse.\n"
    )


def comparison_sentences(summary: dict) -> str:
    """Per paired comparison, its reading with the figures it rests on: the mean paired difference and its p-value
    (significant or not at CLAIM_P), and both objectives' measured estimator noise ("" without comparisons)."""
    lines = []
    ref = summary["reference"]
    for name, c in summary["comparisons"].items():
        t = c["t_test"]
        word = "ahead of" if t["mean"] > 0 else "behind"
        significant = "significant" if t["p"] < CLAIM_P else "not significant"
        line = (
            f"{name} ends {word} {ref} by {abs(t['mean']):.3f} on average (paired t-test p = {t['p']:.3f}, {significant} "
            f"at {CLAIM_P:g})"
        )
        mine, theirs = noise_of(summary, name), noise_of(summary, ref)
        if mine is not None and theirs is not None:
            line += (
                f"; pure-noise log-ratio sd at the start {mine['log_ratio_sd']:.3f} against {theirs['log_ratio_sd']:.3f} "
                f"for {ref}"
            )
        lines.append(line + ".")
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


def headline(summary: dict) -> str:
    """The README front page's summary of the default study: gains, the paired test, the grad norms and the
    estimator noise measured in the study's setting ("" without both stable_drl and the reference)."""
    objectives, comparisons = summary["objectives"], summary["comparisons"]
    if "stable_drl" not in objectives or REFERENCE not in objectives or "stable_drl" not in comparisons:
        return ""
    sd, ref, c = objectives["stable_drl"], objectives[REFERENCE], comparisons["stable_drl"]
    t, sign = c["t_test"], c["sign_test"]
    seeds = sign["positive"] + sign["negative"] + sign["zero"]
    study = summary["settings"]["study"]
    noise = noise_of(summary, "stable_drl")
    noise_text = (
        ""
        if noise is None
        else f"; pure-noise sequence log-ratio sd {noise['log_ratio_sd']:.3f} at the start, largest of "
        f"{noise['pairs']} weights {noise['weight_max']:.3g}"
    )
    return (
        f"On a tiny LLaDA-architecture model fed the official estimator inputs ({study['likelihood_estimator']} in "
        f"blocks of {study.get('estimator_block_size')} on the {study['max_completion_length']}-token canvas, "
        f"{study['mc_samples']} MC samples, fresh masks, num_iterations {study['num_iterations']}{noise_text}), "
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
    main, coupled = os.path.join(docs_dir, file_names("")[0]), os.path.join(docs_dir, file_names("coupled")[0])
    if "headline" in blocks and os.path.isfile(coupled):  # the same study with the paired estimator, if run
        blocks["headline"] += other_estimator_sentence(results.read_json(main), results.read_json(coupled))
    return blocks


def other_estimator_sentence(main: dict, other: dict) -> str:
    """The headline's second sentence: the same study with another estimator, read against the estimator noise
    measured in both studies' own settings ("" when either lacks stable_drl, grpo_seq or its noise record).

    The reading names the comparison it rests on: whether the other estimator's pure-noise log-ratio sd is above or
    below the main study's, and whether StableDRL's paired lead over GRPO grew or shrank."""
    for summary in (main, other):
        objectives, comparisons = summary["objectives"], summary["comparisons"]
        if "stable_drl" not in objectives or REFERENCE not in objectives or "stable_drl" not in comparisons:
            return ""
        if noise_of(summary, "stable_drl") is None:
            return ""
    t_main, t_other = main["comparisons"]["stable_drl"]["t_test"], other["comparisons"]["stable_drl"]["t_test"]
    sd_main, sd_other = noise_of(main, "stable_drl")["log_ratio_sd"], noise_of(other, "stable_drl")["log_ratio_sd"]
    study_main, study_other = main["settings"]["study"], other["settings"]["study"]
    noisier = sd_other > sd_main
    if t_other["p"] >= CLAIM_P:
        result = f"no significant paired difference (p = {t_other['p']:.3f} >= {CLAIM_P:g})"
    elif t_other["mean"] > 0:
        result = f"StableDRL ahead by {t_other['mean']:.3f} (p = {t_other['p']:.3f})"
    else:
        result = f"GRPO ahead by {-t_other['mean']:.3f} (p = {t_other['p']:.3f})"
    lead_grew = t_other["mean"] > t_main["mean"]
    if noisier != lead_grew:  # noise up and lead down, or noise down and lead up
        reading = (
            f"StableDRL's paired lead moved from {t_main['mean']:+.3f} to {t_other['mean']:+.3f} while the noise "
            f"went {'up' if noisier else 'down'}, so these two studies do not show that StableDRL's gain grows "
            "with estimator noise"
        )
    else:
        reading = (
            f"StableDRL's paired lead moved from {t_main['mean']:+.3f} to {t_other['mean']:+.3f} as the noise went "
            f"{'up' if noisier else 'down'}: in the direction of a noise-driven gain, but two estimators differ in "
            "more than their noise, so this is not a dose-response"
        )
    return (
        f"With {study_other['likelihood_estimator']} (blocks of {study_other.get('estimator_block_size')}, "
        f"{study_other['mc_samples']} MC samples), whose pure-noise log-ratio sd in this setting is {sd_other:.3f} "
        f"against {sd_main:.3f} for {study_main['likelihood_estimator']} ({'noisier' if noisier else 'less noisy'}), "
        f"the same study gives StableDRL {other['objectives']['stable_drl']['gain']:+.3f} and GRPO "
        f"{other['objectives'][REFERENCE]['gain']:+.3f}: {result}. {reading}.\n"
    )


def interpretation_sentences(docs_dir: str = results.DOCS) -> list[tuple[str, list[dict]]]:
    """Every sentence of interpretation the stability blocks carry, with the summaries it is rendered from:
    (sentence, [summary, ...]). `tests/scripts/test_interpretation.py` checks each against its JSON."""
    summaries = {}
    for entry in sorted(os.listdir(docs_dir)):
        if entry.startswith("bench_stability") and entry.endswith("_summary.json"):
            summary = results.read_json(os.path.join(docs_dir, entry))
            if "provenance" in summary:
                summaries[summary["settings"]["tag"]] = summary
    out = []
    for summary in summaries.values():
        for text in (
            verdict(summary),
            ending_sentence(summary),
            noise_sentence(summary),
            comparison_sentences(summary),
        ):
            out += [(x, [summary]) for x in split_sentences(text)]
    if "" in summaries:
        main = summaries[""]
        out += [(x, [main]) for x in split_sentences(headline(main).split(" Generated by ")[0])]
        if "coupled" in summaries:
            out += [(x, [main, summaries["coupled"]])
                    for x in split_sentences(other_estimator_sentence(main, summaries["coupled"]))]  # fmt: skip
    return out


def split_sentences(text: str) -> list[str]:
    """Sentences of a rendered text (a period followed by a space or line end, not a decimal point)."""
    import re

    return [x.strip() for x in re.split(r"(?<=\.)\s+(?=[A-Za-z(])", text.strip()) if x.strip()]


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
        "--measure-noise", action="store_true",
        help="train nothing: measure each objective's estimator noise in the study's own setting at the SFT start "
        "and add it to the summary JSON(s) in --output-dir (the one of --tag, or every study with --tag all)",
    )  # fmt: skip
    p.add_argument(
        "--noise-pairs", type=int, default=None, help=f"pure-noise pairs per objective ({NOISE_PAIRS}; --quick 64)"
    )
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
    args.noise_pairs = args.noise_pairs if args.noise_pairs is not None else (64 if quick else NOISE_PAIRS)
    if args.noise_pairs < 2:
        raise SystemExit(f"--noise-pairs={args.noise_pairs} must be >= 2 (a standard deviation needs two pairs).")
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
    if args.measure_noise:
        return add_noise_records(args, argv)
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
    noise_prompts = load_task_dataset("digit_sort", "test", num_samples=64, seed=0)["prompt"]
    summary["estimator_noise"] = {
        "provenance": provenance,
        **measure_noise(summary, model_path, train_dataset, noise_prompts, args.runs_dir, args.noise_pairs),
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


def add_noise_records(args, argv) -> dict:
    """--measure-noise: add `estimator_noise` (with its own provenance) to the study JSON(s) in --output-dir, each
    measured in that study's recorded settings from the SFT warm-up it records. Returns {file name: record}."""
    import torch

    from stabledrl_trl.sft import prepare_sft_model
    from stabledrl_trl.tasks import load_task_dataset

    torch.set_num_threads(args.num_threads)
    provenance = results.provenance(__file__, argv)
    if args.tag == "all":
        names = sorted(e for e in os.listdir(args.output_dir) if e.startswith("bench_stability") and
                       e.endswith("_summary.json"))  # fmt: skip
    else:
        names = [file_names(args.tag)[0]]
    train_dataset = load_task_dataset("digit_sort", "train", seed=0)
    prompts = load_task_dataset("digit_sort", "test", num_samples=64, seed=0)["prompt"]
    written = {}
    for name in names:
        path = os.path.join(args.output_dir, name)
        if not os.path.isfile(path):
            raise SystemExit(f"--measure-noise: {path} does not exist; run the study first (or give --tag).")
        summary = results.read_json(path)
        sft = dict(summary["settings"]["sft"])
        model_path = prepare_sft_model(args.sft_cache_dir, task="digit_sort", progress=False, **sft)
        summary["estimator_noise"] = {
            "provenance": provenance,
            **measure_noise(summary, model_path, train_dataset, prompts, args.runs_dir, args.noise_pairs),
        }
        results.write_json(path, summary)
        written[name] = summary["estimator_noise"]
        print(f"added estimator_noise to {path}", flush=True)
    return written


if __name__ == "__main__":
    main()
