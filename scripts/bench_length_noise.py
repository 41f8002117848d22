"""Estimator noise in the importance weight against answer length, with the trainer's own scoring.

    python scripts/bench_length_noise.py                  # measure, write docs/bench_length_noise.json + docs page
    python scripts/bench_length_noise.py --readme-only    # re-render docs/length_noise.md from the JSON alone
    python scripts/bench_length_noise.py --quick --output-dir /tmp/x   # a smoke test (few pairs, short SFT)

At theta = theta_old the sequence log-ratio L_theta(y) - L_old(y) is pure estimator noise. For each answer length and
estimator setting this script builds a `StableDRLTrainer` with that setting on a tiny LLaDA warmed up by SFT, takes
the gold answers of distinct random prompts as completions (the sorted digits and the EOS: exactly the length wanted;
the long task's warm-up at this budget ends its own rollouts after a few tokens, so rollouts would not have it), and
scores each completion twice on the trainer's old and current mask streams (`stabledrl_trl.estimator_noise`). It reports the standard deviation of the log-ratio and the largest weight
in two forms:
- mean form (what the trainer and the official StableDRL code use): L is a per-token mean (the masked sum of
  log-probabilities divided by the count masked, averaged over MC samples), so log w = L_theta - L_old is a
  difference of per-token means;
- sum form (a sequence log-likelihood): log w_sum = n x log w, n the scored tokens of the completion: the same
  estimate written as a sum over tokens, as an autoregressive sequence ratio exp(sum_t log r_t) is.

Lengths: the stability study's own setting (`digit_sort`, 4 digits + EOS = 5 scored tokens, canvas 8, its SFT
warm-up) and `digit_sort_long` prompts of fixed digit counts (`--digits`, default 31 39 47 55 63: 32-64 scored tokens;
canvas 64, its own SFT warm-up `--long-sft-steps` steps). Estimator settings (`SETTINGS`): block_random with the
official block count (8 blocks of the canvas; on canvas 8 the study's blocks of 2, 4 blocks), block_random with one
block of the whole canvas, and mc_elbo; K = 2 MC samples, fresh masks, as the official recipe.

Writes `--output-dir`/bench_length_noise.json (provenance, settings, one row per length x setting) and the table
between the `length_noise` markers of docs/length_noise.md (`readme_blocks` renders it from the JSON alone).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stabledrl_trl import results  # noqa: E402

JSON_NAME = "bench_length_noise.json"
BLOCK = "length_noise"
# (name, fields): estimator_block_size None means "the official block count": canvas / 8 positions per block
SETTINGS = {
    "block_random_8_blocks": dict(likelihood_estimator="block_random", mc_samples=2, blocks=8),
    "block_random_1_block": dict(likelihood_estimator="block_random", mc_samples=2, blocks=1),
    "mc_elbo": dict(likelihood_estimator="mc_elbo", mc_samples=2, blocks=None),
}
SHORT_SFT = dict(max_steps=200, learning_rate=1e-3, num_samples=5000, completion_length=8)  # configs/tiny.yaml's
LONG_CANVAS = 64
DEFAULT_DIGITS = [31, 39, 47, 55, 63]
CLIP_C = 5.0


def block_size(canvas: int, blocks: int | None, short: bool) -> int | None:
    """estimator_block_size of a setting: the stability study's blocks of 2 on the short canvas for the official
    block-count setting (4 blocks: the study's exact layout), canvas / blocks otherwise; None without blocks."""
    if blocks is None:
        return None
    if short and blocks == 8:
        return 2
    return canvas // blocks


def make_trainer(task: str, model_path: str, canvas: int, fields: dict, output_dir: str, train_dataset):
    """A StableDRLTrainer with the study's CPU rollout settings on `canvas` and the estimator `fields`."""
    from transformers import AutoTokenizer

    from stabledrl_trl import StableDRLConfig, StableDRLTrainer
    from stabledrl_trl.tasks import get_task

    config = StableDRLConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1,
        gradient_checkpointing=False, disable_tqdm=True, max_steps=1, seed=0,
        loss_type="stable_drl", clip_c=CLIP_C, mask_seed_mode="fresh", p_mask_prompt=0.0,
        num_generations=8, per_device_train_batch_size=32, num_iterations=2, temperature=0.9,
        max_completion_length=canvas, block_length=canvas, diffusion_steps=canvas, **fields,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    return StableDRLTrainer(
        model=model_path, reward_funcs=list(get_task(task).reward_funcs), args=config, train_dataset=train_dataset,
        processing_class=tokenizer,
    )  # fmt: skip


def forms(log_r, lengths) -> dict:
    """Mean-form and sum-form statistics of pure-noise log-ratios (N,) with the scored tokens (N,) of each pair."""
    from stabledrl_trl.estimator_noise import noise_summary

    mean = noise_summary(log_r, clip_c=CLIP_C)
    total = noise_summary(log_r * lengths, clip_c=CLIP_C)
    keys = ("log_ratio_sd", "log_ratio_mean", "log_ratio_abs_max", "weight_max", "frac_above_clip_c")
    return {"pairs": mean["pairs"], "mean_form": {k: mean[k] for k in keys}, "sum_form": {k: total[k] for k in keys}}


def gold_batch(tokenizer, examples: list[dict], canvas: int):
    """(prompt_ids (B, P), prompt_mask (B, P), completion_ids (B, C), completion_mask (B, C)) of the gold answers:
    each completion is the sorted digits and the EOS, padded with the pad token to the canvas (mask 0 there), as
    the trainer receives a rollout that ends with that answer; prompts rendered and left-padded as the trainer's."""
    import torch

    from stabledrl_trl.evaluation import left_pad, render_prompt

    ids = [tokenizer(render_prompt(tokenizer, e["prompt"]), add_special_tokens=False)["input_ids"] for e in examples]
    prompt_ids, prompt_mask = left_pad(ids, tokenizer.pad_token_id)
    completion_ids = torch.full((len(examples), canvas), tokenizer.pad_token_id, dtype=torch.long)  # (B, C)
    completion_mask = torch.zeros(len(examples), canvas, dtype=torch.long)  # (B, C)
    for row, e in enumerate(examples):
        answer = tokenizer(e["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if len(answer) > canvas:
            raise ValueError(f"answer of {len(answer)} tokens does not fit the {canvas}-token canvas")
        completion_ids[row, : len(answer)] = torch.tensor(answer)
        completion_mask[row, : len(answer)] = 1
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def measure_one(trainer, batch) -> dict:
    """Pure-noise statistics of one trainer's setting on `batch`, one (old, current) pair per completion."""
    from stabledrl_trl.estimator_noise import pure_noise_log_ratios

    pid, pm, cid, cm = batch
    log_r, _ = pure_noise_log_ratios(trainer, pid, pm, cid, cm, draws=1)
    lengths = cm.sum(-1).double()
    lengths = lengths[lengths > 0]
    return {
        **forms(log_r, lengths),
        "scored_tokens_mean": lengths.mean().item(),
        "scored_tokens_min": int(lengths.min().item()),
        "scored_tokens_max": int(lengths.max().item()),
    }


def run(args, argv) -> dict:
    import torch

    from stabledrl_trl.estimator_noise import trainer_rollouts
    from stabledrl_trl.sft import prepare_sft_model
    from stabledrl_trl.tasks import load_task_dataset

    torch.set_num_threads(args.num_threads)
    provenance = results.provenance(__file__, argv)
    start = time.time()
    short_sft = {**SHORT_SFT, "max_steps": args.short_sft_steps}
    long_sft = dict(max_steps=args.long_sft_steps, learning_rate=1e-3, num_samples=5000, completion_length=LONG_CANVAS)
    short_path = prepare_sft_model(args.sft_cache_dir, task="digit_sort", seed=0, progress=False, **short_sft)
    plan = [("digit_sort", 4, 8, short_path, kind) for kind in ("rollouts", "gold")]
    long_path = prepare_sft_model(args.sft_cache_dir, task="digit_sort_long", seed=0, progress=False, **long_sft)
    plan += [("digit_sort_long", n, LONG_CANVAS, long_path, "gold") for n in args.digits]
    rows = []
    datasets = {}
    for task, digits, canvas, model_path, kind in plan:
        if task not in datasets:
            datasets[task] = load_task_dataset(task, "train", num_samples=64, seed=0)
        examples = make_examples(task, digits, args.pairs, args.seed)
        batch = None
        for name, s in SETTINGS.items():
            fields = {"likelihood_estimator": s["likelihood_estimator"], "mc_samples": s["mc_samples"]}
            size = block_size(canvas, s["blocks"], short=(canvas == 8))
            if size is not None:
                fields["estimator_block_size"] = size
            trainer = make_trainer(task, model_path, canvas, fields, os.path.join(args.runs_dir, f"{task}-{name}"),
                                   datasets[task])  # fmt: skip
            if batch is None and kind == "gold":
                batch = gold_batch(trainer.processing_class, examples, canvas)
            elif batch is None:  # the model's own rollouts, G = 8 per prompt, with the trainer's sampler
                g = trainer.args.num_generations
                prompts = [examples[i // g]["prompt"] for i in range(args.pairs)]
                batch = trainer_rollouts(trainer, prompts, torch.Generator().manual_seed(args.seed))
            row = {"task": task, "digits": digits, "canvas": canvas, "completions": kind, "setting": name, **fields,
                   **measure_one(trainer, batch)}  # fmt: skip
            rows.append(row)
            print(f"{task} {digits} digits {kind} {name}: {row['scored_tokens_mean']:.1f} tokens, mean-form sd "
                  f"{row['mean_form']['log_ratio_sd']:.4f} (largest weight {row['mean_form']['weight_max']:.3g}), "
                  f"sum-form sd {row['sum_form']['log_ratio_sd']:.3f} (largest {row['sum_form']['weight_max']:.3g})",
                  flush=True)  # fmt: skip
    return {
        "provenance": provenance,
        "settings": {
            "pairs": args.pairs,
            "completions": "gold: the gold answers (sorted digits + EOS), one distinct random prompt per pair (the "
            "long task's SFT warm-up at this budget ends its own rollouts early, so rollouts would not have the "
            "length); rollouts: the model's own samples (trainer's sampler, G = 8 per prompt), digit_sort only",
            "seed": args.seed,
            "short_sft": {**short_sft, "task": "digit_sort", "seed": 0},
            "long_sft": {**long_sft, "task": "digit_sort_long", "seed": 0},
            "estimators": SETTINGS,
            "clip_c": CLIP_C,
            "scoring": "StableDRLTrainer._get_per_token_logps_and_entropies on the trainer's old and current mask "
            "streams (fresh masks), model in eval mode at theta = theta_old; no prompt masking",
            "quick": args.quick,
        },
        "rows": rows,
        "seconds": round(time.time() - start, 1),
    }


def make_examples(task: str, digits: int, count: int, seed: int) -> list[dict]:
    """`count` distinct-seeded examples ({"prompt", "answer", ...}) of `digits` random digits each, formatted as the
    task formats its rows; for digit_sort_long, strings whose answer is in the test split (never trained on)."""
    import random

    from stabledrl_trl.tasks import get_task
    from stabledrl_trl.tasks.digit_sort_long import is_test_answer

    rng = random.Random(f"length-noise-{seed}-{digits}")
    out = []
    while len(out) < count:
        s = "".join(rng.choice("0123456789") for _ in range(digits))
        if task == "digit_sort" or is_test_answer("".join(sorted(s))):
            out.append(get_task(task).format_example({"digits": s}))
    return out


# --- rendering: from the JSON alone --------------------------------------------------------------------------------


def render(data: dict) -> str:
    """The docs block: one row per (length, setting), then the sentences read from those rows."""
    s = data["settings"]
    text = (
        f"Pure-noise log-ratio at theta = theta_old, {s['pairs']} pairs per row (one gold completion of a distinct "
        f"prompt and one old / current estimate pair each), K = 2 MC samples, fresh masks, the trainer's own scoring. Mean form: log w = L_theta - "
        f"L_old with L a per-token mean (the trainer's and the official code's form); sum form: n x log w.\n\n"
    )
    header = ["task, digits", "completions", "scored tokens (mean, min-max)", "setting", "estimator block", "mean-form sd",
              "mean-form largest weight", "sum-form sd", "sum-form largest weight", f"sum-form share above C = {s['clip_c']:g}"]  # fmt: skip
    table = []
    for r in data["rows"]:
        table.append([
            f"{r['task']}, {r['digits']}",
            r.get("completions", "gold"),
            f"{r['scored_tokens_mean']:.1f} ({r['scored_tokens_min']}-{r['scored_tokens_max']})",
            f"`{r['likelihood_estimator']}`" + (f" ({r['setting'].split('_', 2)[-1].replace('_', ' ')})"
                                                if r["likelihood_estimator"] == "block_random" else ""),
            str(r.get("estimator_block_size") or "-"),
            f"{r['mean_form']['log_ratio_sd']:.3f}",
            f"{r['mean_form']['weight_max']:.3g}",
            f"{r['sum_form']['log_ratio_sd']:.3f}",
            f"{r['sum_form']['weight_max']:.3g}",
            f"{r['sum_form']['frac_above_clip_c']:.3f}",
        ])  # fmt: skip
    text += results.markdown_table(header, table)
    text += "\n" + reading(data) + "\n"
    text += f"\nWall time {data['seconds'] / 60:.1f} min. " + results.provenance_line(data)
    return text


def reading(data: dict) -> str:
    """Per setting, the shortest against the longest answer: mean-form and sum-form sd and largest weights, with the
    numbers they rest on."""
    lines = []
    for name in data["settings"]["estimators"]:
        rows = sorted((r for r in data["rows"] if r["setting"] == name and r["task"] == "digit_sort_long"),
                      key=lambda r: r["scored_tokens_mean"])  # fmt: skip
        if len(rows) < 2:
            continue
        a, b = rows[0], rows[-1]
        lines.append(
            f"`{name}` on digit_sort_long from {a['scored_tokens_mean']:.1f} to {b['scored_tokens_mean']:.1f} scored "
            f"tokens: mean-form sd {a['mean_form']['log_ratio_sd']:.3f} -> {b['mean_form']['log_ratio_sd']:.3f} "
            f"(largest weight {a['mean_form']['weight_max']:.3g} -> {b['mean_form']['weight_max']:.3g}), sum-form sd "
            f"{a['sum_form']['log_ratio_sd']:.3f} -> {b['sum_form']['log_ratio_sd']:.3f} (largest weight "
            f"{a['sum_form']['weight_max']:.3g} -> {b['sum_form']['weight_max']:.3g})."
        )
    short = {
        (r["completions"], r["setting"]): r for r in data["rows"] if r["task"] == "digit_sort" and "completions" in r
    }
    for name in data["settings"]["estimators"]:
        if ("rollouts", name) in short and ("gold", name) in short:
            a, b = short[("rollouts", name)], short[("gold", name)]
            lines.append(
                f"`{name}` on digit_sort: the model's own rollouts ({a['scored_tokens_mean']:.1f} scored tokens) give "
                f"mean-form sd {a['mean_form']['log_ratio_sd']:.3f} (largest weight {a['mean_form']['weight_max']:.3g}), "
                f"the gold answers ({b['scored_tokens_mean']:.1f} tokens) {b['mean_form']['log_ratio_sd']:.3f} (largest weight "
                f"{b['mean_form']['weight_max']:.3g})"
                + (
                    ": close (within 10%), so the gold-answer rows stand for the model's own samples here."
                    if abs(b["mean_form"]["log_ratio_sd"] / a["mean_form"]["log_ratio_sd"] - 1) <= 0.1
                    else ": they differ, so the gold-answer rows measure the noise on given answers, not on the "
                    "model's own samples."
                )
            )
    return "\n".join(lines)


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{"length_noise": the docs block rendered from docs_dir/bench_length_noise.json} ({} without it)."""
    path = os.path.join(docs_dir, JSON_NAME)
    if not os.path.isfile(path):
        return {}
    return {BLOCK: render(results.read_json(path))}


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--output-dir",
        "--docs-dir",
        dest="output_dir",
        default=None,
        help="JSON folder (default docs/; --quick: outputs/bench_length_noise)",
    )
    p.add_argument(
        "--page",
        default=None,
        help="page to write (default: the README.md or docs/*.md page holding the length_noise markers)",
    )
    p.add_argument("--runs-dir", default="outputs/bench_length_noise/runs", help="trainer output folders")
    p.add_argument("--digits", nargs="+", type=int, default=None, help=f"digit_sort_long lengths ({DEFAULT_DIGITS})")
    p.add_argument("--pairs", type=int, default=None, help="pure-noise pairs per row (default 512)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--short-sft-steps", type=int, default=SHORT_SFT["max_steps"])
    p.add_argument("--long-sft-steps", type=int, default=None, help="digit_sort_long SFT warm-up steps (default 160)")
    p.add_argument("--sft-cache-dir", default=".cache/stabledrl_tiny")
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="smoke test: 16 pairs, 2 lengths, 20 SFT steps; no docs page")
    p.add_argument("--readme-only", action="store_true", help="measure nothing: re-render the docs page from the JSON")
    return p


def parse_args(argv=None):
    from stabledrl_trl.tasks.digit_sort_long import MAX_DIGITS, MIN_DIGITS

    args = make_parser().parse_args(argv)
    q = args.quick
    args.digits = args.digits or ([MIN_DIGITS, MAX_DIGITS] if q else DEFAULT_DIGITS)
    args.pairs = args.pairs if args.pairs is not None else (16 if q else 512)
    args.long_sft_steps = args.long_sft_steps if args.long_sft_steps is not None else (20 if q else 160)
    if q and args.short_sft_steps == SHORT_SFT["max_steps"]:
        args.short_sft_steps = 20
    for d in args.digits:
        if not MIN_DIGITS <= d <= MAX_DIGITS:
            raise SystemExit(f"--digits {d}: digit_sort_long answers have {MIN_DIGITS}-{MAX_DIGITS} digits.")
    for name in ("pairs", "num_threads", "short_sft_steps", "long_sft_steps"):
        if getattr(args, name) < (2 if name == "pairs" else 1):
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)} is too small.")
    if args.output_dir is None:
        args.output_dir = "outputs/bench_length_noise" if q else results.DOCS
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
    if not args.quick:
        results.write_readme_blocks({BLOCK: render(data)}, readme=args.page)
        print(f"wrote {args.output_dir}/{JSON_NAME} and the {BLOCK} block", flush=True)
    return data


if __name__ == "__main__":
    main()
