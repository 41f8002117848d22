"""How much the EOS tail option changes the likelihood estimates: `eos_tail: visible` against `masked` (official).

    python scripts/bench_eos_tail.py                        # SFT-warmed tiny model on digit_sort, 256 rollouts
    python scripts/bench_eos_tail.py --canvas 16 --samples 128
    python scripts/bench_eos_tail.py --rows 128 --samples 32 --write-readme
    python scripts/bench_eos_tail.py --readme-only          # README.md's block from docs/bench_eos_tail.json

A diffusion rollout is a fixed canvas of `max_completion_length` positions; after the first EOS the estimator
shows the rest either as visible EOS tokens ("visible", as the sampler saw them) or as mask tokens ("masked", the
official StableDRL code); the prompt's left padding is hidden in both. The scored tokens, their masks (same per-row
seeds) and the weights are identical; only what the model sees differs.

Rollouts are sampled from the SFT warm-up of `configs/tiny.yaml` (cached in `--sft-cache-dir`) and from the same
architecture at random initialisation; for each, the block-random ELBO (per-token mean, as StableDRL) is computed
with `--samples` Monte-Carlo masks under both options. Printed: the mean ELBO of each, the mean and the largest
per-row difference, and the per-row difference relative to the estimator's own spread (2 samples, the official
count) so the size of the effect can be read against the noise. `--write-readme` writes the result (settings, both
models' rows, provenance: commit, command, versions) to `<docs-dir>/bench_eos_tail.json` and rewrites README.md's
`bench_eos_tail` block from it (`readme_blocks`).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stabledrl_trl import results  # noqa: E402
from stabledrl_trl.cli_checks import parse_checked  # noqa: E402

BLOCK = "bench_eos_tail"
TEMPERATURE = 0.9  # rollouts at the official temperature
P_MASK_PROMPT = 0.15  # the official block-random estimator masks prompt tokens too
SFT = dict(task="digit_sort", seed=0, max_steps=200, learning_rate=1e-3, num_samples=5000, completion_length=8)
MODELS = {
    "sft": f"SFT warm-up (`configs/tiny.yaml`, {SFT['max_steps']} steps)",
    "random": "same architecture, random init",
}


def measure(model, tokenizer, prompts, args, canvas: int, samples: int, seed: int) -> dict:
    """Rollouts of `prompts`, then block-random ELBOs under eos_tail visible and masked (same seeds)."""
    import torch

    from stabledrl_trl import StableDRLConfig
    from stabledrl_trl.diffusion.family import as_diffusion_lm, get_family
    from stabledrl_trl.diffusion.seeding import row_seeds
    from stabledrl_trl.evaluation import left_pad, render_prompt

    family = get_family("llada")
    adapter = as_diffusion_lm(model, tokenizer=tokenizer)
    ids = [tokenizer(render_prompt(tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts]
    prompt_ids, prompt_mask = left_pad(ids, tokenizer.pad_token_id)

    def config(**kw):
        return StableDRLConfig(
            output_dir=os.path.join(args.output_dir, "unused"), use_cpu=True, bf16=False, report_to="none",
            max_completion_length=canvas, block_length=canvas, diffusion_steps=canvas, temperature=TEMPERATURE,
            likelihood_estimator="block_random", estimator_block_size=args.block_size, p_mask_prompt=P_MASK_PROMPT,
            **kw,
        )  # fmt: skip

    with torch.no_grad():
        out = family.generate(
            adapter, prompt_ids, prompt_mask, config(),
            eos_token_ids=adapter.eos_token_ids, generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        cid, cm = out.completion_ids, out.completion_mask  # (B, canvas)
        seeds = row_seeds(prompt_ids, prompt_mask, cid, cm, seed)
        result = {}
        for tail in ("visible", "masked"):
            for k in (samples, 2):
                est = family.estimate(
                    adapter, prompt_ids, prompt_mask, cid, cm, config(eos_tail=tail, mc_samples=k),
                    seeds=seeds, fill_token_id=tokenizer.eos_token_id,
                )  # fmt: skip
                result[(tail, k)] = est.seq_logps.double()
    has_tail = cm.sum(-1) < canvas
    diff = result[("masked", samples)] - result[("visible", samples)]  # (B,)
    noise = (result[("visible", 2)] - result[("visible", samples)]).std().item()
    return {
        "rows": len(prompts),
        "rows_with_tail": int(has_tail.sum()),
        "tail_length_mean": float((canvas - cm.sum(-1)).float().mean()),
        "elbo_visible": result[("visible", samples)].mean().item(),
        "elbo_masked": result[("masked", samples)].mean().item(),
        "diff_mean": diff[has_tail].mean().item() if has_tail.any() else 0.0,
        "abs_diff_mean": diff[has_tail].abs().mean().item() if has_tail.any() else 0.0,
        "abs_diff_max": diff.abs().max().item(),
        "no_tail_abs_diff_max": diff[~has_tail].abs().max().item() if (~has_tail).any() else 0.0,
        "estimator_sd_k2": noise,
    }


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=256, help="held-out digit_sort prompts (one rollout each)")
    p.add_argument("--canvas", type=int, default=8, help="max_completion_length (configs/tiny.yaml: 8)")
    p.add_argument("--block-size", type=int, default=2, help="estimator_block_size")
    p.add_argument("--samples", type=int, default=64, help="Monte-Carlo masks per estimate (precision)")
    p.add_argument("--sft-cache-dir", default=".cache/stabledrl_tiny")
    p.add_argument("--output-dir", default="outputs/bench_eos_tail")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--docs-dir", default=results.DOCS, help="where --write-readme writes bench_eos_tail.json")
    p.add_argument("--write-readme", action="store_true",
                   help="write <docs-dir>/bench_eos_tail.json and the bench_eos_tail block (docs/*.md) from it")  # fmt: skip
    p.add_argument("--readme-only", action="store_true",
                   help="measure nothing: rewrite the block (docs/*.md) from <docs-dir>/bench_eos_tail.json")  # fmt: skip
    return p


# --- README rendering: from the JSON alone ------------------------------------------------------------------------


def render(data: dict) -> str:
    """The README block: the setting, one table row per model, the trained model's effect against the estimator's
    noise and the rows without a tail in two sentences, and the provenance line."""
    s, rows = data["settings"], data["rows"]
    text = (
        f"Block-random ELBO (per-token mean), {s['samples']} MC masks per estimate (same per-row masks under both "
        f"options), {s['canvas']}-position canvas, estimator blocks of {s['block_size']}, prompt masking "
        f"{data['p_mask_prompt']}; one rollout per held-out digit_sort prompt ({s['rows']}) at temperature "
        f"{data['temperature']}.\n\n"
    )
    header = ["model", "rows with a tail", "mean tail length", "ELBO visible", "ELBO masked",
              "mean diff (masked - visible)", "mean abs diff", "max abs diff", "estimator sd at K = 2"]  # fmt: skip
    table = [
        [MODELS[key], f"{r['rows_with_tail']}/{r['rows']}", f"{r['tail_length_mean']:.2f}", f"{r['elbo_visible']:.4f}",
         f"{r['elbo_masked']:.4f}", f"{r['diff_mean']:+.3f}", f"{r['abs_diff_mean']:.3f}", f"{r['abs_diff_max']:.3f}",
         f"{r['estimator_sd_k2']:.3f}"]
        for key, r in rows.items()
    ]  # fmt: skip
    text += results.markdown_table(header, table)
    sft = rows["sft"]
    untouched = max(r["no_tail_abs_diff_max"] for r in rows.values())
    text += (
        f"\nOn the trained model the masked tail changes the per-token ELBO by {sft['diff_mean']:+.3f} on average "
        f"over the rows with a tail and a row by up to {sft['abs_diff_max']:.2f}, against a 2-sample estimator sd of "
        f"{sft['estimator_sd_k2']:.2f}. Rows without a tail: largest difference {untouched:.3g}"
        f"{' (unchanged)' if untouched == 0 else ''}.\n"
    )
    return text + results.provenance_line(data)


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{"bench_eos_tail": the block rendered from docs_dir/bench_eos_tail.json} ({} when the file is absent)."""
    path = os.path.join(docs_dir, f"{BLOCK}.json")
    return {BLOCK: render(results.read_json(path))} if os.path.isfile(path) else {}


def main(argv=None):
    args = parse_checked(make_parser(), argv)
    if args.readme_only:
        results.rewrite_readme_only(readme_blocks(args.docs_dir), args.docs_dir, f"{BLOCK}.json")
        return {}
    provenance = results.provenance(__file__, argv)  # the code as the run starts
    if args.write_readme:
        results.check_readme_blocks([BLOCK])
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stabledrl_trl.sft import prepare_sft_model
    from stabledrl_trl.tasks import load_task_dataset

    torch.set_num_threads(1)
    path = prepare_sft_model(args.sft_cache_dir, progress=False, **SFT)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    prompts = load_task_dataset("digit_sort", "test", num_samples=args.rows, seed=0)["prompt"]
    trained = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.random.fork_rng():
        torch.manual_seed(args.seed)
        random_init = AutoModelForCausalLM.from_config(trained.config).eval()
    rows = {
        "sft": measure(trained, tokenizer, prompts, args, args.canvas, args.samples, args.seed),
        "random": measure(random_init, tokenizer, prompts, args, args.canvas, args.samples, args.seed),
    }
    settings = {k: v for k, v in vars(args).items() if k not in ("write_readme", "readme_only", "docs_dir")}
    data = {"provenance": provenance, "settings": settings, "sft": SFT, "temperature": TEMPERATURE, "p_mask_prompt": P_MASK_PROMPT,
            "rows": rows}  # fmt: skip
    print(render(data))
    if args.write_readme:
        out = os.path.join(args.docs_dir, f"{BLOCK}.json")
        results.write_json(out, data)
        results.write_readme_blocks(readme_blocks(args.docs_dir))
        print(f"wrote {out} and its page's {BLOCK} block")
    return rows


if __name__ == "__main__":
    main()
