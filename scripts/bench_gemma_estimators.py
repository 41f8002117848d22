"""DiffusionGemma's uniform-noise estimator: its noise at theta = theta_old, per form and self-conditioning choice.

    python scripts/bench_gemma_estimators.py                  # writes docs/bench_gemma_estimators.json
    python scripts/bench_gemma_estimators.py --write-readme   # also the table in docs/diffusion_gemma.md
    python scripts/bench_gemma_estimators.py --readme-only    # the table from the committed JSON alone

Measured as `scripts/bench_estimators.py` measures the masked estimators: at theta = theta_old a StableDRL / GRPO
log-ratio is the difference of two independent estimates of the same model on the same completion, pure estimator
noise. For each form ("block_random", "block_random_coupled": antithetic t, shared corruption), K and
self-conditioning choice ("off", "on", "training"), this script draws `--repeats` pairs per completion (per-row
seeds, as the trainer) and reports the standard deviation of L_1 - L_2 (per-token mean scale, as the trainer's
sequence estimate), its mean with its standard error (zero for an unbiased pair), the mean estimate, the variance
relative to block_random K = 2 with self-conditioning off, and the decoder passes per completion.

Model: the tiny random DiffusionGemma (`tiny.tiny_diffusion_gemma_config`, canvas 8, seed 0); completions: its own
sampler's rollouts (`gemma_sampler`, 16 tokens = 2 canvases, 4 denoising steps, temperature 1) from `--prompts`
random digit prompts. The JSON records the commit, the command and the package versions.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

JSON_NAME = "bench_gemma_estimators.json"
BLOCK = "bench_gemma_estimators"
BASELINE = ("block_random", 2, "off")


def measure(args) -> dict:
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    from stabledrl_trl.diffusion.gemma_sampler import gemma_generate, gemma_sampler_settings, row_generators
    from stabledrl_trl.diffusion.uniform_estimators import estimator_passes, uniform_noise_estimate
    from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_diffusion_gemma_config

    torch.set_num_threads(args.num_threads)
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(tiny_diffusion_gemma_config()).eval()
    g = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(3, 8, (args.prompts,), generator=g).tolist()
    texts = ["".join(str(int(d)) for d in torch.randint(0, 10, (n,), generator=g)) for n in lengths]
    enc = tok(texts, return_tensors="pt", padding=True)  # left-padded
    settings = gemma_sampler_settings(model, max_new_tokens=16, max_denoising_steps=4, temperature=1.0)
    with torch.no_grad():
        out = gemma_generate(model, enc["input_ids"], enc["attention_mask"], settings, eos_token_ids=(0,),
                             pad_token_id=0, generators=row_generators(g, len(texts), "cpu"))  # fmt: skip
    N, R = len(texts), args.repeats
    rep = lambda t: t.repeat_interleave(R, 0)  # noqa: E731  (N R, ...): R pairs per completion
    rows = []
    base_var = None
    for form in ("block_random", "block_random_coupled"):
        for k in (2, 4):
            for sc in ("off", "on", "training"):
                pair = []
                for which in (0, 1):
                    seeds = (
                        torch.arange(N * R) * 2 + which + 1_000_003 * (k + 10 * ["off", "on", "training"].index(sc))
                    )
                    with torch.no_grad():
                        est = uniform_noise_estimate(
                            model, rep(enc["input_ids"]), rep(enc["attention_mask"]), rep(out.completion_ids),
                            rep(out.completion_mask), seeds=seeds, fill_token_id=0, num_samples=k, estimator=form,
                            self_conditioning=sc,
                        )  # fmt: skip
                    pair.append(est.seq_logps.double())
                diff = pair[0] - pair[1]
                var = float(diff.var())
                if (form, k, sc) == BASELINE:
                    base_var = var
                rows.append(
                    dict(
                        estimator=form,
                        mc_samples=k,
                        self_conditioning=sc,
                        log_ratio_std=var**0.5,
                        log_ratio_mean=float(diff.mean()),
                        log_ratio_mean_se=float(diff.std() / len(diff) ** 0.5),
                        mean_estimate=float(torch.cat(pair).mean()),
                        passes=estimator_passes(k, sc),
                        variance=var,
                    )  # fmt: skip
                )
                print(rows[-1], flush=True)
    for r in rows:
        r["variance_vs_baseline"] = r.pop("variance") / base_var
    return {"completions": N, "repeats": R, "canvas_length": 8, "completion_tokens": 16, "rows": rows}


def render(data: dict) -> str:
    from stabledrl_trl.results import markdown_table, provenance_line

    rows = [
        [
            r["estimator"],
            r["mc_samples"],
            r["self_conditioning"],
            r["passes"],
            f"{r['log_ratio_std']:.4f}",
            f"{r['variance_vs_baseline']:.2f}",
            f"{r['log_ratio_mean']:+.4f} +- {r['log_ratio_mean_se']:.4f}",
            f"{r['mean_estimate']:.3f}",
        ]  # fmt: skip
        for r in data["rows"]
    ]
    head = ["estimator", "K", "self-conditioning", "decoder passes", "std of log-ratio at theta_old",
            "variance / block_random K=2 off", "mean log-ratio (+- s.e.)", "mean estimate"]  # fmt: skip
    intro = (
        f"Tiny random DiffusionGemma, {data['completions']} rollouts of {data['completion_tokens']} tokens "
        f"(canvas {data['canvas_length']}), {data['repeats']} independent estimate pairs each.\n\n"
    )
    return intro + markdown_table(head, rows) + "\n" + provenance_line(data)


def readme_blocks(docs_dir: str) -> dict[str, str]:
    """{block: table} rendered from the committed JSON in `docs_dir` alone ({} when absent)."""
    from stabledrl_trl.results import read_json

    path = os.path.join(docs_dir, JSON_NAME)
    return {BLOCK: render(read_json(path))} if os.path.exists(path) else {}


def make_parser() -> argparse.ArgumentParser:
    from stabledrl_trl.results import DOCS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--repeats", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--docs-dir", default=DOCS, help="where the JSON is written (and read by --readme-only)")
    p.add_argument("--write-readme", "--write-docs", action="store_true", help="also write the docs table")
    p.add_argument("--readme-only", action="store_true", help="measure nothing: re-render the table from the JSON")
    return p


def main(argv=None):
    from stabledrl_trl.results import provenance, rewrite_readme_only, write_json, write_readme_blocks

    a = make_parser().parse_args(argv)
    if a.readme_only:
        blocks = readme_blocks(a.docs_dir)
        rewrite_readme_only(blocks, a.docs_dir, JSON_NAME)
        return blocks
    data = {"provenance": provenance("scripts/bench_gemma_estimators.py", argv), **measure(a)}
    write_json(os.path.join(a.docs_dir, JSON_NAME), data)
    text = render(data)
    print(text)
    if a.write_readme:
        write_readme_blocks({BLOCK: text})
    return data


if __name__ == "__main__":
    main()
