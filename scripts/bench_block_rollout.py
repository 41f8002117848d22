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

Usage: python scripts/bench_block_rollout.py [--model sdar|llada2] [--gen-length 256] [--batch-size 4] ...
Prints a table: mode, seconds, generated tokens/s, speed-up over recompute, token identity.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

try:
    import stabledrl_trl  # noqa: F401
except ImportError:  # run from a checkout without installing: the package sits next to scripts/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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
    return p


def build_model(args):
    from stabledrl_trl.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM
    from stabledrl_trl.models.sdar import SDARConfig, SDARForCausalLM
    from stabledrl_trl.tiny import tiny_llada2_config_dict, tiny_sdar_config_dict

    if args.model == "llada2":
        config = LLaDA2MoeConfig(
            **tiny_llada2_config_dict(
                vocab_size=args.vocab_size,
                hidden_size=args.hidden_size,
                intermediate_size=4 * args.hidden_size,
                moe_intermediate_size=args.hidden_size // 2,
                num_hidden_layers=args.layers,
                num_attention_heads=args.heads,
                num_key_value_heads=args.kv_heads,
                head_dim=args.hidden_size // args.heads,
                max_position_embeddings=args.prompt_length + args.gen_length + 2 * args.block_size,
                block_size=args.block_size,
            )
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(args.seed)
            model = LLaDA2MoeModelLM(config)
        return model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    config = SDARConfig(
        **tiny_sdar_config_dict(
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
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        model = SDARForCausalLM(config)
    return model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()


def run(args) -> list[dict]:
    """Time both modes once each (after a short warm-up) and return one result row per mode."""
    from stabledrl_trl.diffusion.block_sampler import block_generate

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = build_model(args)
    g = torch.Generator().manual_seed(args.seed)
    B, P = args.batch_size, args.prompt_length
    prompt = torch.randint(2, args.vocab_size, (B, P), generator=g)
    mask = torch.ones(B, P, dtype=torch.long)
    for row in range(B):  # ragged prompts: row r has r % 4 left-padding positions
        mask[row, : row % 4] = 0
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


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    rows = run(args)
    print_table(rows, args)
    return 0 if rows[0]["identical"] else 1  # differing tokens would mean the cache is not exact


if __name__ == "__main__":
    raise SystemExit(main())
