"""Evaluation speed: problems per second of a protocol run on the tiny model, per sampler setting and batch size.

    python scripts/bench_eval.py                      # prints the table
    python scripts/bench_eval.py --write-readme       # docs/bench_eval.json and the table in docs/evaluation.md
    python scripts/bench_eval.py --readme-only        # the table from the committed JSON

A tiny LLaDA-architecture model (`stabledrl_trl.tiny`, random weights, float32) is evaluated with the official
StableDRL GSM8K protocol (`--protocol stabledrl --task gsm8k`: raw questions, greedy decoding) on `--rows` synthetic
questions, through `protocol_eval.run_protocol` (the code `scripts/evaluate.py --protocol` runs), under each sampler
setting of `SETTINGS` scaled to `--length` tokens: the official StableDRL shape (one token per step, block 8), d1's
(steps = length / 2, block 32), and d1's with the approximate prefix cache and with confidence-threshold decoding;
each at batch 1 and batch 8. Reported: wall-clock seconds, problems per second and model calls per problem (a call decodes a whole batch). The
grades are not the point (random weights); the speed is. Times are wall-clock on a shared CPU (other jobs move them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stabledrl_trl import results  # noqa: E402

BLOCK = "bench_eval"
JSON_NAME = "bench_eval.json"
# name -> (steps as a fraction of the length, block, extra sampler settings)
SETTINGS = {
    "official StableDRL (1 token / step, block 8)": (1.0, 8, {}),
    "d1 (2 tokens / step, block 32)": (0.5, 32, {}),
    "d1 + prefix cache": (0.5, 32, {"rollout_cache": "prefix"}),
    "d1 + threshold 0.9": (0.5, 32, {"parallel_threshold": 0.9}),
}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16, help="Synthetic problems evaluated per setting.")
    parser.add_argument("--length", type=int, default=64, help="Generation length (a multiple of 32).")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads.")
    parser.add_argument("--docs-dir", default=results.DOCS)
    parser.add_argument(
        "--readme",
        default=None,
        help="The page to write (default: the page holding the block's markers, docs/evaluation.md).",
    )
    parser.add_argument("--write-readme", action="store_true", help="Write the JSON and the docs table.")
    parser.add_argument("--readme-only", action="store_true", help="Rewrite the docs table from the JSON only.")
    return parser


def _model_and_tokenizer():
    import torch
    from tokenizers import Regex, pre_tokenizers

    from stabledrl_trl.models.llada import LLaDAConfig, LLaDAModelLM
    from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict

    tokenizer = build_tiny_tokenizer()
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LLaDAModelLM(LLaDAConfig(**tiny_llada_config_dict())).float().eval()
    return model, tokenizer


def measure(rows: int, length: int, batch_sizes: list[int]) -> list[dict]:
    from stabledrl_trl.protocol_eval import run_protocol
    from stabledrl_trl.protocols import get_protocol

    if length % 32:
        raise SystemExit(f"--length={length} must be a multiple of 32 (d1's block).")
    model, tokenizer = _model_and_tokenizer()
    data = [{"question": f"Tom has {i} apples and buys {i + 3}. How many now?", "answer": f"#### {2 * i + 3}"}
            for i in range(rows)]  # fmt: skip
    calls = {"n": 0}
    original = model.forward

    def counting(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    model.forward = counting
    warm_sampler = {"max_completion_length": 32, "diffusion_steps": 32, "block_length": 32}
    warm = get_protocol("stabledrl", "gsm8k", overrides=warm_sampler)
    run_protocol(model, tokenizer, warm, data[:2], progress=False)  # first-call costs out of the first row
    out = []
    for name, (fraction, block, extra) in SETTINGS.items():
        for batch in batch_sizes:
            sampler = {"max_completion_length": length, "diffusion_steps": int(length * fraction),
                       "block_length": block, **extra}  # fmt: skip
            protocol = get_protocol("stabledrl", "gsm8k", overrides={**sampler, "batch_size": batch})
            calls["n"] = 0
            start = time.perf_counter()
            run = run_protocol(model, tokenizer, protocol, data, progress=False)
            seconds = time.perf_counter() - start
            out.append({
                "setting": name, "batch_size": batch, "length": length, "steps": sampler["diffusion_steps"],
                "block": block, "extra": extra, "rows": rows, "seconds": seconds,
                "problems_per_second": rows / seconds, "forwards_per_problem": calls["n"] / rows,
                "new_rows": run["new_rows"],
            })  # fmt: skip
            print(f"{name:45s} batch {batch}: {rows / seconds:7.2f} problems/s ({seconds:.2f} s)", flush=True)
    return out


def render(data: dict) -> str:
    rows = [[r["setting"], r["batch_size"], r["steps"], r["block"], f"{r['seconds']:.2f}",
             f"{r['problems_per_second']:.2f}", f"{r['forwards_per_problem']:.1f}"] for r in data["rows"]]  # fmt: skip
    head = (
        f"Tiny LLaDA-architecture model (random weights, float32), protocol `stabledrl` / gsm8k with the sampler "
        f"settings below at length {data['rows'][0]['length']}, {data['rows'][0]['rows']} synthetic problems per "
        f"row; {data['device']}, {data['threads']} thread(s); wall-clock.\n\n"
    )
    table = results.markdown_table(
        ["setting", "batch", "steps", "block", "seconds", "problems / s", "model calls / problem"], rows
    )
    return head + table + "\n" + results.provenance_line(data)


def readme_blocks(docs_dir: str) -> dict[str, str]:
    """{block: rendering} of the committed JSON in `docs_dir` ({} when absent): the table of docs/evaluation.md."""
    path = os.path.join(docs_dir, JSON_NAME)
    return {BLOCK: render(results.read_json(path))} if os.path.exists(path) else {}


def main(argv=None) -> dict:
    args = make_parser().parse_args(argv)
    path = os.path.join(args.docs_dir, JSON_NAME)
    if args.readme_only:
        results.rewrite_readme_only(readme_blocks(args.docs_dir), args.docs_dir, JSON_NAME, args.readme)
        return results.read_json(path)
    if args.write_readme:
        results.check_readme_blocks([BLOCK], args.readme)
    import torch

    torch.set_num_threads(args.threads)
    provenance = results.provenance(__file__, argv)  # the tree as it was when the measurement started
    data = {
        "rows": measure(args.rows, args.length, args.batch_sizes),
        "device": "cpu",
        "threads": args.threads,
        "provenance": provenance,
    }
    print(render(data))
    if args.write_readme:
        results.write_json(path, data)
        results.write_readme_blocks({BLOCK: render(data)}, args.readme)
    return data


if __name__ == "__main__":
    main()
