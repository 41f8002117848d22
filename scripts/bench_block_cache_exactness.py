"""Exactness of the cached block-diffusion rollouts on a device: SDAR's sampler with its key/value cache of committed
blocks against the same sampler recomputing the whole prefix at every forward (`use_cache=False`), at temperature 0.

The cache is exact in arithmetic (attention is block-causal, so committed blocks never change); on a device the two
paths run different kernel shapes, so their floating-point results may differ in the last bits. The script reports,
per dtype, the token agreement of the two paths' completions and the largest logit difference of the first denoising
forward (cached vs full), on a random SDAR-architecture model (Qwen3 layout) built locally. Random weights give a
near-flat softmax, where a last-bit difference can flip an argmax: float32 is the exactness check (expected match
1.000), bfloat16 shows the size of that effect. Writes JSON.

Usage: python scripts/bench_block_cache_exactness.py [--device cuda] [--tiny] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

try:
    import stabledrl_trl  # noqa: F401
except ImportError:  # run from a checkout without installing: the package sits next to scripts/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stabledrl_trl.cli_checks import parse_checked  # noqa: E402
from stabledrl_trl.diffusion.block_sampler import block_generate
from stabledrl_trl.models.sdar import SDARConfig, SDARForCausalLM
from stabledrl_trl.tiny import tiny_sdar_config_dict


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (seconds on a CPU)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--prompt-length", type=int, default=64)
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p


def build(tiny: bool, dtype: torch.dtype, device: str, seed: int) -> SDARForCausalLM:
    shape = (
        dict(vocab_size=512)
        if tiny
        else dict(
            vocab_size=32768,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=64,
            max_position_embeddings=4096,
        )
    )
    config = SDARConfig(**tiny_sdar_config_dict(**shape))  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SDARForCausalLM(config)
    return model.to(device=device, dtype=dtype).eval()


def check(a, dtype_name: str) -> dict:
    dtype = getattr(torch, dtype_name)
    model = build(a.tiny, dtype, a.device, a.seed)
    g = torch.Generator().manual_seed(a.seed)
    B, P = a.batch_size, a.prompt_length
    ids = torch.randint(2, model.config.vocab_size, (B, P), generator=g).to(a.device)
    lengths = torch.randint(P // 2, P + 1, (B,), generator=g)
    mask = (torch.arange(P)[None, :] >= P - lengths[:, None]).long().to(a.device)  # left padding
    ids = ids * mask
    kwargs = dict(mask_token_id=1, eos_token_ids=[0], pad_token_id=0, block_size=4, gen_length=a.gen_length,
                  temperature=0.0, remasking="low_confidence_static")  # fmt: skip
    with torch.no_grad():
        cached = block_generate(model, ids, mask, **kwargs)
        full = block_generate(model, ids, mask, use_cache=False, **kwargs)
    real = cached.completion_mask.bool() | full.completion_mask.bool()
    same = (cached.completion_ids == full.completion_ids) & real
    return {
        "dtype": dtype_name,
        "rows": B,
        "tokens": int(real.sum()),
        "match": float(same.sum() / real.sum().clamp(min=1)),
        "identical": bool(torch.equal(cached.completion_ids, full.completion_ids)),
    }


def main(argv: list[str] | None = None) -> dict:
    a = parse_checked(make_parser(), argv)
    if a.tiny:
        a.batch_size, a.prompt_length, a.gen_length = (
            min(a.batch_size, 4),
            min(a.prompt_length, 16),
            min(a.gen_length, 16),
        )
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {a.device}: no CUDA device visible to torch; use --device cpu")
    rows = [check(a, d.strip()) for d in a.dtypes.split(",") if d.strip()]
    result = {"device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu", "rows": rows,
              "float32_exact": all(r["identical"] for r in rows if r["dtype"] == "float32")}  # fmt: skip
    for r in rows:
        print(f"{r['dtype']:<9} cached vs full prefix: token match {r['match']:.3f} over {r['tokens']} tokens, "
              f"identical {r['identical']}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
