"""Block-diffusion rollouts: SDAR's exact KV cache of committed blocks vs recomputing the whole prefix every step.

Both modes run `stabledrl_trl.diffusion.block_sampler.block_generate` on the same prompts, seeds and model; the
cached mode prefills the block-aligned prompt once, runs each denoising step on the current block only against the
cache and stores each clean block with one more forward; the recompute mode (`use_cache=False`) runs every step as a
full block-causal forward over prompt + everything generated so far. Attention is block-causal, so the cache is
exact: the tokens must be identical (checked and printed), only the time differs.

Model (`--model`): an SDAR-architecture model (`stabledrl_trl.models.sdar.SDARForCausalLM`, Qwen3 with block-causal
attention) or a LLaDA2-architecture MoE model (`stabledrl_trl.models.llada2.LLaDA2MoeModelLM`, 8 routed experts of
width hidden/2, 2 per token, one shared; first layer dense), built locally with random weights (no download), sizes
below. With `--model llada2` the sampler runs LLaDA2's rules (whole-block canvas, full-softmax candidates). EOS is excluded from the vocabulary's reachable
tokens (its logit is never the argmax of a random model anyway, and the EOS id is set outside the vocabulary) so that
every row generates all `--gen-length` tokens and both modes do the full amount of work.

Times are wall-clock seconds (`time.perf_counter`), so other load on a shared machine moves them.

    python scripts/bench_block_rollout.py [--model sdar|llada2] [--gen-length 256] [--batch-size 4] ...
    python scripts/bench_block_rollout.py --gen-length 256 --threads 1 --write-readme
    python scripts/bench_block_rollout.py --readme-only     # README.md's blocks from docs/bench_block_rollout_*.json

Prints a table: mode, seconds, generated tokens/s, speed-up over recompute, forwards, token identity.
`--write-readme` writes the result (settings, the model's shape, rows, provenance: commit, command, versions) to
`<docs-dir>/bench_block_rollout_<model>.json` and rewrites README.md's `bench_block_rollout_<model>` block from it
(`readme_blocks`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

try:
    import stabledrl_trl  # noqa: F401
except ImportError:  # run from a checkout without installing: the package sits next to scripts/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stabledrl_trl import results  # noqa: E402
from stabledrl_trl.cli_checks import parse_checked  # noqa: E402

MODELS = ("sdar", "llada2")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="sdar", choices=["sdar", "llada2"], help="architecture of the random model")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda[:i]")
    p.add_argument("--gen-length", type=int, default=256, help="new tokens per row")
    p.add_argument("--prompt-length", type=int, default=64, help="prompt tokens per row (rows get 0-3 fewer)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=None, help="denoising steps per block (None = block size)")
    p.add_argument("--remasking", default="low_confidence_static")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (None keeps torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--docs-dir", default=results.DOCS, help="where --write-readme writes bench_block_rollout_<model>.json"
    )
    p.add_argument("--write-readme", action="store_true",
                   help="write <docs-dir>/bench_block_rollout_<model>.json and the block (docs/*.md) from it")  # fmt: skip
    p.add_argument("--readme-only", action="store_true",
                   help="measure nothing: rewrite the blocks (README.md or docs/*.md) from the JSON files in --docs-dir")  # fmt: skip
    return p


def build_model(args):
    """A random model of the chosen architecture at the benchmark's shape (LLaDA2: the experts sized from it too)."""
    from stabledrl_trl.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM
    from stabledrl_trl.models.sdar import SDARConfig, SDARForCausalLM
    from stabledrl_trl.tiny import tiny_llada2_config_dict, tiny_sdar_config_dict

    shape = dict(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=4 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden_size // args.heads,
        max_position_embeddings=args.prompt_length + args.gen_length + 2 * args.block_size,
        block_size=args.block_size,
    )
    if args.model == "llada2":
        config = LLaDA2MoeConfig(**tiny_llada2_config_dict(**shape, moe_intermediate_size=args.hidden_size // 2))
        model_class = LLaDA2MoeModelLM
    else:
        config, model_class = SDARConfig(**tiny_sdar_config_dict(**shape)), SDARForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        model = model_class(config)
    return model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()


def ragged_prompt_mask(batch_size: int, prompt_length: int) -> torch.Tensor:
    """(B, P) attention mask of left-padded prompts: row r has r % 4 padding positions on the left."""
    mask = torch.ones(batch_size, prompt_length, dtype=torch.long)
    for row in range(batch_size):
        mask[row, : row % 4] = 0
    return mask


def run(args) -> list[dict]:
    """Time both modes once each (after a short warm-up) and return one result row per mode."""
    from stabledrl_trl.diffusion.block_sampler import block_generate

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = build_model(args)
    g = torch.Generator().manual_seed(args.seed)
    B, P = args.batch_size, args.prompt_length
    prompt = torch.randint(2, args.vocab_size, (B, P), generator=g)
    mask = ragged_prompt_mask(B, P)
    prompt, mask = prompt.to(args.device), mask.to(args.device)
    common = dict(mask_token_id=1, eos_token_ids=[args.vocab_size + 1], pad_token_id=0, block_size=args.block_size,
                  denoising_steps=args.steps, temperature=args.temperature, remasking=args.remasking,
                  generator=torch.arange(B) + args.seed)  # fmt: skip
    if args.model == "llada2":
        common.update(whole_blocks=True, mask_candidate=True)
    warm = dict(common, gen_length=2 * args.block_size)
    block_generate(model, prompt, mask, use_cache=True, **warm)
    block_generate(model, prompt, mask, use_cache=False, **warm)
    rows, outputs = [], {}
    for name, use_cache in (("recompute prefix", False), ("KV cache", True)):
        start = time.perf_counter()
        out = block_generate(model, prompt, mask, gen_length=args.gen_length, use_cache=use_cache, **common)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        outputs[name] = out
        tokens = int(out.completion_mask.sum())
        rows.append({"mode": name, "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                     "forwards": out.num_forwards})  # fmt: skip
    same = torch.equal(outputs["KV cache"].completion_ids, outputs["recompute prefix"].completion_ids)
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / base
        row["identical"] = same
    return rows


def print_table(rows, args) -> None:
    print(
        f"block rollouts: batch {args.batch_size}, prompt {args.prompt_length}, {args.gen_length} new tokens, block "
        f"{args.block_size}, steps/block {args.steps or args.block_size}, {args.model} hidden {args.hidden_size} x "
        f"{args.layers} layers, {args.dtype}, {args.device}"
    )
    print("| mode | seconds | tokens/s | x recompute | forwards | identical tokens |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['seconds']:.2f} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f} | {r['forwards']} | "
              f"{'yes' if r['identical'] else 'NO'} |")  # fmt: skip


def model_shape(model) -> dict:
    """The sizes of the built model that the README states (from its config)."""
    c = model.config
    keys = [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "block_size",
    ]
    keys += [
        "num_experts",
        "moe_intermediate_size",
        "num_experts_per_tok",
        "num_shared_experts",
        "first_k_dense_replace",
    ]
    return {k: getattr(c, k) for k in keys if getattr(c, k, None) is not None}


# --- README rendering: from the JSON alone ------------------------------------------------------------------------


def _architecture(data: dict) -> str:
    m = data["model_shape"]
    text = (
        f"hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, GQA {m['num_attention_heads']}/"
        f"{m['num_key_value_heads']}, vocab {m['vocab_size']}"
    )
    if data["settings"]["model"] == "llada2":
        dense = m["first_k_dense_replace"]
        text += (
            f", the first {'layer' if dense == 1 else f'{dense} layers'} dense, then {m['num_experts']} experts of width "
            f"{m['moe_intermediate_size']}, {m['num_experts_per_tok']} per token, {m['num_shared_experts']} shared"
        )
    return text


def render(data: dict) -> str:
    """The README block of one model: the setting, the two modes' table, the speed-up and the forward counts in one
    sentence, and the provenance line."""
    s, rows = data["settings"], data["rows"]
    name = {"sdar": "SDAR", "llada2": "LLaDA2"}[s["model"]]
    lengths = data["prompt_lengths"]
    threads = f", {s['threads']} thread{'s' if s['threads'] != 1 else ''}" if s["threads"] else ""
    steps = s["steps"] or data["model_shape"]["block_size"]
    text = (
        f"{name}-architecture model ({_architecture(data)}), random weights, {s['dtype']}; batch {s['batch_size']} "
        f"ragged prompts of {min(lengths)}-{max(lengths)} tokens, block {data['model_shape']['block_size']}, {steps} "
        f"steps per block ({s['remasking']}), temperature {s['temperature']:g}, no reachable EOS so every row "
        f"generates all {s['gen_length']} tokens; {s['device']}{threads}; wall-clock seconds.\n\n"
    )
    text += results.markdown_table(
        ["mode", "seconds", "tokens/s", "x recompute", "forwards", "identical tokens"],
        [[r["mode"], f"{r['seconds']:.2f}", f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}", r["forwards"],
          "yes" if r["identical"] else "NO"] for r in rows],
    )  # fmt: skip
    full, cached = rows
    extra = cached["forwards"] - full["forwards"]
    text += (
        f"\nThe KV cache is {cached['speedup']:.2f}x as fast as recomputing the prefix, with "
        f"{'identical' if cached['identical'] else 'DIFFERENT'} tokens; it runs {abs(extra)} "
        f"{'more' if extra >= 0 else 'fewer'} forwards ({cached['forwards']} against {full['forwards']}).\n"
    )
    return text + results.provenance_line(data)


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{"bench_block_rollout_<model>": rendered block} for every docs_dir/bench_block_rollout_<model>.json."""
    blocks = {}
    for model in MODELS:
        path = os.path.join(docs_dir, f"bench_block_rollout_{model}.json")
        if os.path.isfile(path):
            blocks[f"bench_block_rollout_{model}"] = render(results.read_json(path))
    return blocks


def main(argv=None) -> int:
    args = parse_checked(make_parser(), argv)
    if args.readme_only:
        results.rewrite_readme_only(readme_blocks(args.docs_dir), args.docs_dir, "bench_block_rollout_<model>.json")
        return 0
    block = f"bench_block_rollout_{args.model}"
    provenance = results.provenance(__file__, argv)  # the code as the run starts
    if args.write_readme:
        results.check_readme_blocks([block])
    rows = run(args)
    print_table(rows, args)
    if args.write_readme:
        build = build_model(args)
        settings = {k: v for k, v in vars(args).items() if k not in ("write_readme", "readme_only", "docs_dir")}
        data = {
            "provenance": provenance,
            "settings": settings,
            "model_shape": model_shape(build),
            "prompt_lengths": ragged_prompt_mask(args.batch_size, args.prompt_length).sum(1).tolist(),
            "rows": rows,
        }
        path = os.path.join(args.docs_dir, f"{block}.json")
        results.write_json(path, data)
        results.write_readme_blocks({block: readme_blocks(args.docs_dir)[block]})
        print(f"wrote {path} and its page's {block} block")
    return 0 if rows[0]["identical"] else 1  # differing tokens would mean the cache is not exact


if __name__ == "__main__":
    raise SystemExit(main())
