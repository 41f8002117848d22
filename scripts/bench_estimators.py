"""Likelihood-estimator noise at theta = theta_old: what each estimator puts into the sequence log-ratio by itself.

    python scripts/bench_estimators.py                      # both shapes, writes docs/bench_estimators.json
    python scripts/bench_estimators.py --write-readme       # also the table in docs/estimators.md (between its markers)
    python scripts/bench_estimators.py --model sft          # the SFT warm-up, trained first if not cached
    python scripts/bench_estimators.py --readme-only        # docs/estimators.md's table from docs/bench_estimators.json

A StableDRL or GRPO weight is exp(L_theta - L_old), each L an estimate with its own random masks. At theta = theta_old
the log-ratio is pure estimator noise: two independent estimates of the same model on the same completion. For every
estimator, number of forward passes K and Gauss-Legendre node count, this script draws `--repeats` such pairs per
completion (per-row seeds, as the trainer draws them) and reports the standard deviation of L_1 - L_2, its mean (zero
for an unbiased pair; with its standard error), the mean estimate (estimators differ in what they estimate:
block_random's official SPG bound is not the ELBO), the variance relative to block_random at K = 2 on the same rows,
and the forward passes per completion. Scoring follows the trainer (`DiffusionFamily.estimate`: the rollout canvas,
its EOS tail visible), with no prompt masking (p_mask_prompt = 0, as configs/tiny.yaml and the stability study).

Shapes:
- "embedded": the tiny LLaDA of configs/tiny.yaml (d_model 128, 4 layers): its SFT warm-up when cached in
  `--sft-cache-dir` (`--model auto`, the default), or trained first (`--model sft`), else the same architecture at
  random initialisation (`--model random`); one rollout per held-out digit_sort prompt (canvas 8, temperature 0.9);
  estimator blocks of 8 (one block; the stability study uses blocks of 2, i.e. 4 blocks on the canvas, and records
  the noise in its own setting: `scripts/bench_stability.py --measure-noise`).
- "larger": the same architecture at random initialisation on a 64-position canvas (its rollouts: up to 64 tokens),
  estimator blocks of 16 (4 blocks).
The result goes to `--output` (JSON with the commit, the command and package versions) and is printed as markdown;
`--write-readme` puts that markdown between the `bench_estimators` markers of the page holding them
(docs/estimators.md); `--readme-only` (also spelt `--readme-from-json`) does only that, from the committed JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from stabledrl_trl import results  # noqa: E402  (after the path insert; a light module: no torch)
from stabledrl_trl.cli_checks import parse_checked  # noqa: E402

MARK_START = "<!-- bench_estimators:start -->"
MARK_END = "<!-- bench_estimators:end -->"
DEFAULT_OUTPUT = os.path.join("docs", "bench_estimators.json")
SFT = dict(task="digit_sort", seed=0, max_steps=200, learning_rate=1e-3, num_samples=5000, completion_length=8)
BASELINE = ("block_random", 2)  # variances are relative to the official estimator at its official K


def settings_grid(ks=(2, 4, 8), nodes=(1, 2, 3, 4, 5)) -> list[dict]:
    """Every (estimator, mc_samples, sdmc_nodes) measured: K in `ks` for the Monte-Carlo estimators, one pass per
    node for sdmc and two for sdmc_coupled (passes up to max(ks))."""
    grid = [dict(estimator="mean_field", mc_samples=1, nodes=None)]
    for name in ("mc_elbo", "mc_elbo_inv_t", "block_random", "block_random_coupled", "coupled"):
        grid += [dict(estimator=name, mc_samples=k, nodes=None) for k in ks]
    grid += [dict(estimator="sdmc", mc_samples=n, nodes=n) for n in nodes]
    grid += [dict(estimator="sdmc_coupled", mc_samples=2 * n, nodes=n) for n in nodes if 2 * n <= max(ks)]
    return grid


def rollouts(model, tokenizer, prompts, canvas: int, seed: int):
    """One rollout per prompt with LLaDA's sampler (one block of `canvas`, one token per step, temperature 0.9)."""
    import torch

    from stabledrl_trl.diffusion.family import as_diffusion_lm, get_family
    from stabledrl_trl.evaluation import left_pad, render_prompt

    adapter = as_diffusion_lm(model, tokenizer=tokenizer)
    ids = [tokenizer(render_prompt(tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts]
    prompt_ids, prompt_mask = left_pad(ids, tokenizer.pad_token_id)
    config = estimator_config(canvas, "block_random", 2, None, canvas)
    with torch.no_grad():
        out = get_family("llada").generate(
            adapter, prompt_ids, prompt_mask, config,
            eos_token_ids=adapter.eos_token_ids, generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
    return adapter, prompt_ids, prompt_mask, out.completion_ids, out.completion_mask


def estimator_config(canvas: int, estimator: str, mc_samples: int, nodes: int | None, block_size: int):
    from stabledrl_trl import StableDRLConfig

    return StableDRLConfig(
        output_dir=os.path.join(ROOT, "outputs", "bench_estimators"), use_cpu=True, bf16=False, report_to="none",
        max_completion_length=canvas, block_length=canvas, diffusion_steps=canvas, temperature=0.9,
        likelihood_estimator=estimator, mc_samples=mc_samples, sdmc_nodes=nodes, estimator_block_size=block_size,
        p_mask_prompt=0.0, eos_tail="visible",
    )  # fmt: skip


def measure(adapter, tokenizer, prompt_ids, prompt_mask, cid, cm, *, canvas, block_size, repeats, seed, grid):
    """Rows of the table for one model: per setting, `repeats` pairs of independent estimates of every completion."""
    import torch

    from stabledrl_trl.diffusion.family import get_family
    from stabledrl_trl.diffusion.seeding import row_seeds

    family = get_family("llada")
    rows = []
    for s in grid:
        config = estimator_config(canvas, s["estimator"], s["mc_samples"], s["nodes"], block_size)
        diffs, values = [], []
        with torch.no_grad():
            for r in range(repeats):
                pair = [
                    family.estimate(
                        adapter, prompt_ids, prompt_mask, cid, cm, config,
                        seeds=row_seeds(prompt_ids, prompt_mask, cid, cm, seed, stream, r),
                        fill_token_id=tokenizer.eos_token_id,
                    ).seq_logps.double()
                    for stream in (1, 2)
                ]  # fmt: skip
                diffs.append(pair[0] - pair[1])
                values += pair
        d = torch.cat(diffs)  # (repeats * B,) pure estimator noise in L_theta - L_old
        rows.append(
            {
                **s,
                "passes": family.estimator_passes(config),
                "log_ratio_sd": d.std().item(),
                "log_ratio_mean": d.mean().item(),
                "log_ratio_mean_se": d.std().item() / math.sqrt(d.numel()),
                "estimate_mean": torch.cat(values).mean().item(),
            }
        )
    base = next(r for r in rows if (r["estimator"], r["mc_samples"]) == BASELINE)
    for r in rows:
        r["variance_vs_block_random_k2"] = (r["log_ratio_sd"] / base["log_ratio_sd"]) ** 2
    return rows


def render(result: dict) -> str:
    """The markdown of a result (what --write-readme puts in the README)."""
    lines = [
        f"`{result['command']}` (commit `{result['commit'][:12]}`; torch {result['versions']['torch']}). "
        "sd of L_1 - L_2 at theta = theta_old (two independent estimates of each completion, "
        f"{result['repeats']} pairs per completion); variance relative to block_random at K = 2.",
    ]
    for shape in result["shapes"]:
        lines += [
            "",
            f"**{shape['name']}**: {shape['model']}; {shape['rows']} completions, canvas {shape['canvas']}, "
            f"{shape['real_tokens_mean']:.1f} scored tokens on average, estimator blocks of {shape['block_size']}.",
            "",
            "| estimator | nodes | passes | sd of log-ratio | variance vs block_random K=2 | mean log-ratio (se) "
            "| mean estimate |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in shape["table"]:
            lines.append(
                f"| `{r['estimator']}` | {r['nodes'] if r['nodes'] is not None else '-'} | {r['passes']} | "
                f"{r['log_ratio_sd']:.4f} | {r['variance_vs_block_random_k2']:.3f} | "
                f"{r['log_ratio_mean']:+.4f} ({r['log_ratio_mean_se']:.4f}) | {r['estimate_mean']:.4f} |"
            )
    return "\n".join(lines)


def write_readme(path: str | None, markdown: str) -> None:
    """Replace the text between the bench_estimators markers by `markdown`: in `path`, or (None) in the page among
    README.md and docs/*.md that holds them (results.block_page)."""
    results.check_readme_blocks(["bench_estimators"], readme=path)
    written = results.write_readme_blocks({"bench_estimators": markdown + "\n"}, readme=path)
    print(f"wrote the bench_estimators block of {', '.join(written)}")


def readme_blocks(docs_dir: str) -> dict[str, str]:
    """{"bench_estimators": the README block rendered from docs_dir/bench_estimators.json} (as write_readme writes it)."""
    path = os.path.join(docs_dir, os.path.basename(DEFAULT_OUTPUT))
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return {"bench_estimators": render(json.load(f)) + "\n"}


def readme_block(path: str) -> str:
    """The text between the README's markers (without the newlines next to them)."""
    with open(path) as f:
        text = f.read()
    return text.split(MARK_START, 1)[1].split(MARK_END, 1)[0].strip("\n")


def _versions() -> dict:
    import numpy
    import torch
    import transformers
    import trl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "numpy": numpy.__version__,
    }


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "stabledrl_trl", "scripts"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load_embedded_model(choice: str, cache_dir: str):
    """(model, tokenizer, description): the SFT warm-up of configs/tiny.yaml, or the architecture at random init."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stabledrl_trl.sft import SFT_SETTINGS_FILE, TINY_SFT_MODEL, build_tiny_model, prepare_sft_model
    from stabledrl_trl.tiny import build_tiny_tokenizer

    if choice in ("auto", "sft"):
        if choice == "sft" or _cached_sft(cache_dir, SFT_SETTINGS_FILE):
            path = prepare_sft_model(cache_dir, progress=False, **SFT)
            tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
            model = AutoModelForCausalLM.from_pretrained(path).eval()
            return model, tokenizer, "SFT warm-up of configs/tiny.yaml (200 steps, seed 0)"
    tokenizer = build_tiny_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_tiny_model(tokenizer, seed=0, **TINY_SFT_MODEL).eval()
    return model, tokenizer, "configs/tiny.yaml's architecture at random initialisation (no SFT warm-up cached)"


def _cached_sft(cache_dir: str, settings_file: str) -> bool:
    from stabledrl_trl.sft import TINY_SFT_MODEL, sft_cache_key

    settings = {
        "task": SFT["task"],
        "seed": SFT["seed"],
        "num_samples": SFT["num_samples"],
        "max_steps": SFT["max_steps"],
        "learning_rate": SFT["learning_rate"],
        "batch_size": 32,
        "completion_length": SFT["completion_length"],
        "model": dict(TINY_SFT_MODEL),
        "training": {},
    }
    target = os.path.join(cache_dir, f"sft-{SFT['task']}-{sft_cache_key(settings)}")
    return os.path.isfile(os.path.join(target, settings_file))


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("auto", "sft", "random"), default="auto",
                   help="embedded shape: the SFT warm-up if cached (auto), trained if needed (sft), or random init")  # fmt: skip
    p.add_argument("--sft-cache-dir", default=os.path.join(ROOT, ".cache", "stabledrl_tiny"))
    p.add_argument(
        "--rows", type=int, default=128, help="embedded shape: held-out digit_sort prompts, one rollout each"
    )
    p.add_argument("--large-rows", type=int, default=32, help="larger shape: prompts, one rollout each")
    p.add_argument("--large-canvas", type=int, default=64, help="larger shape: max_completion_length")
    p.add_argument("--large-block-size", type=int, default=16, help="larger shape: estimator_block_size")
    p.add_argument("--repeats", type=int, default=4, help="pairs of independent estimates per completion")
    p.add_argument("--max-passes", type=int, default=8, help="largest K (Monte-Carlo estimators: 2, 4, ... up to it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=DEFAULT_OUTPUT, help="JSON result (relative to the repository root)")
    p.add_argument("--write-readme", action="store_true", help="write the table between its markers (in docs/estimators.md)")
    p.add_argument("--skip-larger", action="store_true", help="measure the embedded shape only (smoke runs)")
    p.add_argument("--readme-from-json", "--readme-only", action="store_true",
                   help="measure nothing: write the block (docs/estimators.md) from the existing --output JSON")  # fmt: skip
    return p


def main(argv=None) -> dict:
    args = parse_checked(make_parser(), argv)
    output = args.output if os.path.isabs(args.output) else os.path.join(ROOT, args.output)
    if args.readme_from_json:
        with open(output) as f:
            result = json.load(f)
        write_readme(None, render(result))
        return result
    for name in ("rows", "large_rows", "large_canvas", "large_block_size", "repeats", "max_passes"):
        if getattr(args, name) < 1 or (name == "max_passes" and args.max_passes < 2):
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)} is too small.")
    import torch

    from stabledrl_trl.sft import TINY_SFT_MODEL, build_tiny_model
    from stabledrl_trl.tasks import load_task_dataset

    torch.set_num_threads(1)
    ks = tuple(k for k in (2, 4, 8, 16, 32) if k <= args.max_passes)
    grid = settings_grid(ks=ks, nodes=tuple(n for n in range(1, 6) if n <= args.max_passes))
    model, tokenizer, description = load_embedded_model(args.model, args.sft_cache_dir)
    prompts = load_task_dataset("digit_sort", "test", num_samples=max(args.rows, args.large_rows), seed=0)["prompt"]
    shapes = []
    plan = [("embedded", model, description, args.rows, 8, 8)]
    if not args.skip_larger:
        with torch.random.fork_rng():
            torch.manual_seed(1)
            large = build_tiny_model(tokenizer, seed=1, **TINY_SFT_MODEL).eval()
        plan.append(("larger", large, "the same architecture at random initialisation (seed 1)", args.large_rows,
                     args.large_canvas, args.large_block_size))  # fmt: skip
    for name, m, what, n_rows, canvas, block in plan:
        adapter, pid, pm, cid, cm = rollouts(m, tokenizer, prompts[:n_rows], canvas, args.seed)
        table = measure(adapter, tokenizer, pid, pm, cid, cm, canvas=canvas, block_size=block, repeats=args.repeats,
                        seed=args.seed, grid=grid)  # fmt: skip
        shapes.append(
            {
                "name": name,
                "model": what,
                "rows": n_rows,
                "canvas": canvas,
                "block_size": block,
                "real_tokens_mean": cm.sum(-1).double().mean().item(),
                "table": table,
            }
        )
    given = sys.argv[1:] if argv is None else list(argv)
    command = "python scripts/bench_estimators.py" + "".join(f" {a}" for a in given if a != "--write-readme")
    result = {
        "command": command,
        "commit": _commit(),
        "versions": _versions(),
        "repeats": args.repeats,
        "p_mask_prompt": 0.0,
        "eos_tail": "visible",
        "seed": args.seed,
        "shapes": shapes,
    }
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    markdown = render(result)
    print(markdown)
    if args.write_readme:
        write_readme(None, markdown)
    return result


if __name__ == "__main__":
    main()
