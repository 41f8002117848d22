"""Rollout speed of LLaDA's sampler: the literal loop, the previous default, each exact speedup, each approximate mode.

One run, one model, one set of prompts; every row of the table decodes the same batch and is timed in the same
process, so the ratios are robust to other load on the machine. Rows:
- `literal`: LLaDA's reference loop written out (whole-sequence logits in the model's dtype, Gumbel noise and
  softmax over all (B, L, V) positions, a per-row top-k);
- `previous default`: the sampler before the exact speedups (whole-sequence (B, L, V) logits copied to float32 by
  the adapter, one batch-wide generator, every block decoded even when all rows have finished);
- `exact: block logits`: the output head runs on the current block's positions only (transformers' logits_to_keep);
- `exact` (= the default now): block logits + finished rows leave the batch and decoding stops when all have;
- approximate, opt-in: `prefix cache`, `dual cache` (Fast-dLLM), `threshold 0.9` (confidence-threshold parallel
  decoding), `dual cache + threshold 0.9`.
Columns: tokens/s (real completion tokens, up to and including the first EOS, per second), forward passes per
completion, sampler overhead beyond the model's own forwards, peak memory of the sampler call, ratio to the literal
loop and to `exact`, and the token match with `exact` at temperature 0.

Cases: `standard` (random weights: no row stops early) and `early EOS`: half the rows (those with one pad on the
left of their prompt) get a large EOS logit in the block that ends at mid-canvas, so they finish by mid-canvas, as a
model does whose answers are shorter than the canvas. The bias is applied by a wrapper to whatever logits the model
returns, so every row of the table sees the same model.

Held-out accuracy (`--accuracy-seeds 0,1,2`): the tiny LLaDA of configs/tiny.yaml warmed up by masked-diffusion SFT
on the built-in digit-sorting task (one SFT model per seed, cached under `--sft-cache-dir`), evaluated greedily on
`--accuracy-rows` test rows with every exact and approximate mode, gen_length 8 in blocks of 4, 8 steps (two blocks,
so the caches reuse something).

Default CPU shape (documented in the README): a random LLaDA-architecture model (d_model 256, 4 layers, 4 heads, MLP
704, vocab 32768, float32), batch 4, prompts of 128 tokens, 256 generated tokens, blocks of 32, 128 steps,
temperature 0. On CPU, times are the process's CPU time (`time.process_time`, one thread), which other processes on
a shared machine do not inflate; on CUDA they are wall-clock seconds after synchronising. Peak memory on CPU is the
growth of a fresh subprocess's peak RSS (VmHWM, reset after the model is built) over one sampler call, at 2 steps
per block (the peak does not depend on the step count), with glibc's mmap threshold fixed so freed tensors return to
the system; on CUDA, `torch.cuda.max_memory_allocated` over the call.
`--memory-vocab 126464` adds a table of peak memory at LLaDA-8B's vocabulary for the previous default and `exact`.

`--device cuda`: an LLaDA-8B-shaped random model in bf16 (d_model 4096, 32 layers, 32 heads, MLP 12288, vocab 126464;
built on the device, no hub), batch 16, 256 tokens, block 32, 128 steps (override any size with the flags).

Usage:
  nice python scripts/bench_rollout.py [--json rows.json] [--accuracy-seeds 0,1,2] [--memory-vocab 126464]
  python scripts/bench_rollout.py --device cuda --json gpu.json
  python scripts/bench_rollout.py --tiny   # seconds: tiny shapes, checks the script end to end
  nice python scripts/bench_rollout.py --accuracy-seeds 0,1,2 --memory-vocab 126464 --threads 1 --write-readme
  python scripts/bench_rollout.py --readme-only   # README.md's blocks from docs/bench_rollout*.json

`--write-readme` writes the run (settings, shape, parameter counts, rows, accuracy, provenance: commit, command,
versions) to `<docs-dir>/bench_rollout[_<tag>].json` and rewrites README.md's blocks from it (`readme_blocks`):
`bench_rollout[_<tag>]` (the speed table with its ratios against the targets below) and, with accuracy seeds,
`bench_rollout[_<tag>]_accuracy`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

try:
    import stabledrl_trl  # noqa: F401
except ImportError:  # run from a checkout without installing: the package sits next to scripts/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import stabledrl_trl  # noqa: F401

from stabledrl_trl import results
from stabledrl_trl.cli_checks import parse_checked  # noqa: E402
from stabledrl_trl.diffusion.adapter import DiffusionAdapter
from stabledrl_trl.diffusion.family import as_diffusion_lm
from stabledrl_trl.diffusion.llada_sampler import (
    _top_k_mask,
    completion_mask_from_ids,
    generate,
    uniform_reveal_schedule,
)

MASK_ID, EOS_ID, PAD_ID = 1, 0, 0
ACCURACY_SFT = dict(task="digit_sort", max_steps=200, learning_rate=1e-3, num_samples=5000, completion_length=8)
# The held-out accuracy decode: configs/tiny.yaml's canvas in two blocks, so the caches reuse something.
ACCURACY_DECODE = dict(max_completion_length=8, block_length=4, diffusion_steps=8)
# What the speedups were built for (the README states each ratio against its target).
TARGETS = {
    "exact_vs_previous_default": {"standard": 1.3, "early EOS": 2.0},  # tokens/s, at least
    "exact_overhead": 0.10,  # the sampler's time beyond the model's forwards, at most
    "exact_vs_previous_default_memory": 0.25,  # peak sampler memory at LLaDA-8B's vocabulary, at most
    "vs_exact": {"prefix cache": 2.5, "dual cache + threshold 0.9": 5.0},  # tokens/s, at least
}

# (name, sampler keyword arguments) for the package's sampler; "literal" and "previous default" are below.
PACKAGE_MODES = [
    ("exact: block logits", dict(early_stop=False)),
    ("exact", dict()),
    ("prefix cache", dict(cache="prefix")),
    ("dual cache", dict(cache="dual")),
    ("threshold 0.9", dict(threshold=0.9)),
    ("dual cache + threshold 0.9", dict(cache="dual", threshold=0.9)),
]
APPROXIMATE = {"prefix cache", "dual cache", "threshold 0.9", "dual cache + threshold 0.9"}


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (seconds): checks the script end to end")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--prompt-length", type=int, default=None)
    p.add_argument("--gen-length", type=int, default=None)
    p.add_argument("--block-length", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--d-model", type=int, default=None)
    p.add_argument("--n-layers", type=int, default=None)
    p.add_argument("--n-heads", type=int, default=None)
    p.add_argument("--mlp", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"])
    p.add_argument("--modes", default=None, help="comma-separated subset of the rows (default: all)")
    p.add_argument("--cases", default="standard,early EOS", help="comma-separated: standard, early EOS")
    p.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory column (CPU: one subprocess per row)"
    )
    p.add_argument("--memory-vocab", type=int, default=0, help="also measure peak memory at this vocabulary (0 = no)")
    p.add_argument("--accuracy-seeds", default="", help="e.g. 0,1,2: held-out digit-task accuracy per mode (CPU)")
    p.add_argument("--accuracy-rows", type=int, default=256)
    p.add_argument("--accuracy-only", action="store_true", help="only the held-out accuracy table (no speed rows)")
    p.add_argument("--sft-cache-dir", default=".cache/stabledrl_tiny")
    p.add_argument("--json", default=None, help="write the rows to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: $OMP_NUM_THREADS, else 1); memory workers use 1")  # fmt: skip
    p.add_argument("--tag", default=None, help="--write-readme: docs/bench_rollout_<tag>.json and its blocks")
    p.add_argument("--docs-dir", default=results.DOCS, help="where --write-readme writes bench_rollout[_<tag>].json")
    p.add_argument("--write-readme", action="store_true",
                   help="write <docs-dir>/bench_rollout[_<tag>].json and the blocks (README.md or docs/*.md) from it")  # fmt: skip
    p.add_argument("--readme-only", action="store_true",
                   help="measure nothing: rewrite the blocks (README.md or docs/*.md) from the bench_rollout*.json in --docs-dir")  # fmt: skip
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: measure one row's memory
    return p


def resolve_shape(args) -> dict:
    if args.tiny:
        base = dict(batch_size=4, prompt_length=8, gen_length=16, block_length=4, steps=8, d_model=32, n_layers=2,
                    n_heads=2, mlp=64, vocab_size=512, dtype="float32")  # fmt: skip
    elif args.device.startswith("cuda"):
        base = dict(batch_size=16, prompt_length=128, gen_length=256, block_length=32, steps=128, d_model=4096,
                    n_layers=32, n_heads=32, mlp=12288, vocab_size=126464, dtype="bfloat16")  # fmt: skip
    else:
        base = dict(batch_size=4, prompt_length=128, gen_length=256, block_length=32, steps=128, d_model=256,
                    n_layers=4, n_heads=4, mlp=704, vocab_size=32768, dtype="float32")  # fmt: skip
    for key in base:
        value = getattr(args, key)
        if value is not None:
            base[key] = value
    return base


# ----------------------------------------------------------------------------------------------------------------------
# Model, prompts, the early-EOS wrapper


def build_model(shape: dict, device: str, seed: int):
    from stabledrl_trl.models.llada import LLaDAConfig, LLaDAModelLM
    from stabledrl_trl.tiny import tiny_llada_config_dict

    config = LLaDAConfig(
        **tiny_llada_config_dict(
            vocab_size=shape["vocab_size"], d_model=shape["d_model"], n_heads=shape["n_heads"],
            n_kv_heads=shape["n_heads"], n_layers=shape["n_layers"], mlp_hidden_size=shape["mlp"],
            max_sequence_length=max(4096, shape["prompt_length"] + shape["gen_length"]), rope_theta=500000.0,
        )
    )  # fmt: skip
    dtype = getattr(torch, shape["dtype"])
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # build in the target dtype directly (an 8B float32 copy would not fit)
        try:
            model = LLaDAModelLM(config)
        finally:
            torch.set_default_dtype(default)
    return model.eval()


def make_prompts(shape: dict, early_eos: bool, seed: int):
    """(B, P) prompts; in the early-EOS case every second row is one token shorter (one left pad)."""
    g = torch.Generator().manual_seed(seed)
    b, p = shape["batch_size"], shape["prompt_length"]
    ids = torch.randint(5, shape["vocab_size"], (b, p), generator=g)  # (B, P)
    mask = torch.ones_like(ids)
    if early_eos:
        ids[1::2, 0] = PAD_ID
        mask[1::2, 0] = 0
    return ids, mask


def clock(device: str) -> float:
    """CPU time of this process on CPU (robust to other load), wall-clock time on CUDA."""
    return time.perf_counter() if device.startswith("cuda") else time.process_time()


class Timed:
    """A logits_fn around the adapter that (optionally) plants early EOS and adds up the model's own seconds."""

    def __init__(self, adapter, shape: dict, early_eos: bool, device: str):
        self.adapter, self.device = adapter, device
        self.accepts_logits_to_keep = True
        self.supports_canvas_cache = adapter.supports_canvas_cache
        half = shape["prompt_length"] + shape["gen_length"] // 2
        self.eos_window = (half - shape["block_length"], half) if early_eos else None
        self.seconds = 0.0

    def _sync(self):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def __call__(self, input_ids, attention_mask=None, logits_to_keep=None, cache=None):
        self._sync()
        started = clock(self.device)
        logits = self.adapter(input_ids, attention_mask, logits_to_keep=logits_to_keep, cache=cache)
        self._sync()
        self.seconds += clock(self.device) - started
        if self.eos_window is not None and attention_mask is not None:
            offset = cache.window_start if cache is not None and cache.window_start is not None else 0
            index = logits_to_keep if logits_to_keep is not None else torch.arange(input_ids.shape[1])
            positions = offset + index.to(logits.device)  # (K,) canvas positions of the returned logits
            lo, hi = self.eos_window
            hit = (positions >= lo) & (positions < hi)  # (K,)
            rows = attention_mask[:, 0] == 0  # (R,) the rows that stop early (a pad on the left)
            logits[:, :, EOS_ID] += 40.0 * (rows[:, None] & hit[None, :]).to(logits.dtype)
        return logits


# ----------------------------------------------------------------------------------------------------------------------
# The two reference rows


@torch.no_grad()
def literal_generate(fn, ids, mask, *, gen_length, block_length, steps, temperature, generator):
    """LLaDA's reference loop, batched as LLaDA's code is: whole-sequence logits, noise and softmax every step.

    As in the package's sampler (and the tests' transcription), the mask token is never a candidate. Returns the
    completions (B, G).
    """
    b, p = ids.shape
    x = torch.full((b, p + gen_length), MASK_ID, dtype=torch.long, device=ids.device)
    x[:, :p] = ids
    attention = torch.cat([mask, torch.ones(b, gen_length, dtype=mask.dtype, device=mask.device)], dim=1)
    num_blocks = gen_length // block_length
    per_block = steps // num_blocks
    for block in range(num_blocks):
        start, end = p + block * block_length, p + (block + 1) * block_length
        counts = uniform_reveal_schedule((x[:, start:end] == MASK_ID).sum(1), per_block)  # (B, per_block)
        for i in range(per_block):
            mask_index = x == MASK_ID
            logits = fn(x, attention, logits_to_keep=torch.arange(x.shape[1], device=x.device))  # (B, L, V) all
            logits[:, :, MASK_ID] = -torch.inf
            if temperature > 0:
                u = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=logits.device)
                scored = logits.double() - temperature * torch.log(-torch.log(u))
            else:
                scored = logits
            x0 = scored.argmax(-1)  # (B, L)
            x0_p = torch.softmax(logits, dim=-1).gather(-1, x0[..., None]).squeeze(-1).double()  # (B, L)
            x0_p[:, end:] = -torch.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -torch.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(b):
                transfer[j, torch.topk(confidence[j], k=int(counts[j, i])).indices] = True
            x[transfer] = x0[transfer]
    return x[:, p:]


@torch.no_grad()
def previous_default_generate(fn, ids, mask, *, gen_length, block_length, steps, temperature, generator):
    """The sampler as it was before the exact speedups (no guidance, low-confidence remasking)."""
    b, p = ids.shape
    x = torch.full((b, p + gen_length), MASK_ID, dtype=torch.long, device=ids.device)
    x[:, :p] = ids
    attention = torch.cat([mask, torch.ones(b, gen_length, dtype=mask.dtype, device=mask.device)], dim=1)
    num_blocks = gen_length // block_length
    per_block = steps // num_blocks
    for block in range(num_blocks):
        start, end = p + block * block_length, p + (block + 1) * block_length
        counts = uniform_reveal_schedule((x[:, start:end] == MASK_ID).sum(1), per_block)
        for step in range(per_block):
            logits = fn(x, attention, logits_to_keep=torch.arange(x.shape[1], device=x.device))  # (B, L, V) float32
            block_logits = logits[:, start:end].to(torch.float32, copy=True)  # (B, block, V)
            del logits
            block_logits[..., MASK_ID] = -torch.inf
            if temperature > 0:
                u = torch.rand(block_logits.shape, generator=generator, dtype=torch.float64, device=x.device)
                candidates = (block_logits.double() - temperature * torch.log(-torch.log(u))).argmax(-1)
            else:
                candidates = block_logits.argmax(-1)
            probs = torch.softmax(block_logits, dim=-1)
            confidence = probs.gather(-1, candidates[..., None]).squeeze(-1)
            del probs
            current = x[:, start:end]
            confidence = torch.where(current == MASK_ID, confidence.double(), -torch.inf)
            reveal = _top_k_mask(confidence, counts[:, step])
            x[:, start:end] = torch.where(reveal, candidates, current)
    return x[:, p:]


# ----------------------------------------------------------------------------------------------------------------------
# Running one row


def run_mode(name, fn, ids, mask, shape, temperature, seed):
    """Decode the batch with one mode; returns (completion_ids, completion_mask, forward passes per completion)."""
    generator = torch.Generator(device=ids.device).manual_seed(seed)
    common = dict(gen_length=shape["gen_length"], block_length=shape["block_length"], steps=shape["steps"])
    if name == "literal":
        out = literal_generate(fn, ids, mask, temperature=temperature, generator=generator, **common)
        return out, completion_mask_from_ids(out, (EOS_ID,)), float(shape["steps"])
    if name == "previous default":
        out = previous_default_generate(fn, ids, mask, temperature=temperature, generator=generator, **common)
        return out, completion_mask_from_ids(out, (EOS_ID,)), float(shape["steps"])
    kwargs = dict(PACKAGE_MODES)[name]
    out = generate(fn, ids, mask, mask_token_id=MASK_ID, temperature=temperature, eos_token_ids=(EOS_ID,),
                   generator=generator, **common, **kwargs)  # fmt: skip
    return out.completion_ids, out.completion_mask, float(out.forward_passes.float().mean())


def match_rate(ids, mask, ref_ids, ref_mask) -> float:
    """Share of positions (real in either output) where the two completions agree in token and in realness."""
    union = mask.bool() | ref_mask.bool()
    same = (ids == ref_ids) & (mask == ref_mask) & union
    return float(same.sum()) / max(int(union.sum()), 1)


def _rss_mib(field: str) -> float:
    """VmRSS (resident now) or VmHWM (peak since the last reset) of this process, in MiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux: writing 5 to /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def memory_worker(payload: str) -> None:
    """Subprocess: build the model and batch, then report the peak-RSS growth over one sampler call (MiB)."""
    job = json.loads(payload)
    shape, name, early, device = job["shape"], job["mode"], job["early_eos"], job["device"]
    torch.set_num_threads(1)
    model = build_model(shape, device, job["seed"])
    fn = Timed(as_diffusion_lm(model, eos_token_ids=[EOS_ID], pad_token_id=PAD_ID), shape, early, device)
    ids, mask = make_prompts(shape, early, job["seed"])
    _reset_peak_rss()  # the peak of building the model is not the sampler's
    before = _rss_mib("VmRSS")
    run_mode(name, fn, ids, mask, shape, job["temperature"], job["seed"])
    print(json.dumps({"peak_mem_mib": _rss_mib("VmHWM") - before}))


def measure_memory(name, shape, early, args, fn=None, ids=None, mask=None) -> float:
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run_mode(name, fn, ids, mask, shape, args.temperature, args.seed)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    # Memory does not depend on the number of steps per block beyond two (a full and a windowed forward).
    mem_shape = dict(shape, steps=2 * (shape["gen_length"] // shape["block_length"]))
    payload = json.dumps(dict(shape=mem_shape, mode=name, early_eos=early, device=args.device, seed=args.seed,
                              temperature=args.temperature))  # fmt: skip
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, __file__, "--worker", payload], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"memory worker for {name!r} failed:\n{result.stderr[-2000:]}")
    return float(json.loads(result.stdout.strip().splitlines()[-1])["peak_mem_mib"])


# ----------------------------------------------------------------------------------------------------------------------
# Held-out accuracy on the digit task


def accuracy_table(args, modes) -> dict:
    """{mode: [accuracy per seed]} on the tiny SFT model (one per seed), greedy, gen 8 in two blocks of 4."""
    from transformers import AutoModelForCausalLM

    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
    from stabledrl_trl.evaluation import evaluate_model
    from stabledrl_trl.sft import prepare_sft_model
    from stabledrl_trl.tasks import load_task_dataset
    from stabledrl_trl.tiny import build_tiny_tokenizer

    seeds = [int(s) for s in args.accuracy_seeds.split(",") if s.strip()]
    tokenizer = build_tiny_tokenizer()
    test = load_task_dataset("digit_sort", "test", num_samples=args.accuracy_rows, seed=0)
    results = {name: [] for name in modes}
    for seed in seeds:
        # the settings of configs/tiny.yaml's warm-up
        path = prepare_sft_model(args.sft_cache_dir, seed=seed, progress=False, **ACCURACY_SFT)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        for name in modes:
            options = dict(PACKAGE_MODES).get(name)
            if options is None:
                continue
            adapter = CountingAdapter(model, tokenizer)
            settings = SamplerSettings.from_fields(
                **ACCURACY_DECODE, temperature=0.0, rollout_cache=options.get("cache", "none"),
                parallel_threshold=options.get("threshold"),
            )  # fmt: skip
            res = evaluate_model(adapter, tokenizer, test, "digit_sort", settings=settings, batch_size=128, seed=seed,
                                 progress=False)  # fmt: skip
            results[name].append((res["accuracy"], adapter.row_forwards / res["num_rows"]))
    return results


class CountingAdapter(DiffusionAdapter):
    """The tiny model's adapter, counting row-forwards (one per row per model call)."""

    def __init__(self, model, tokenizer):
        base = as_diffusion_lm(model, tokenizer)
        super().__init__(model, base.family_object, base.mask_token_id, base.eos_token_ids, base.pad_token_id)
        self.row_forwards = 0

    def __call__(self, input_ids, *args, **kwargs):
        self.row_forwards += input_ids.shape[0]
        return super().__call__(input_ids, *args, **kwargs)


# ----------------------------------------------------------------------------------------------------------------------


def main(argv=None) -> list[dict]:
    args = parse_checked(make_parser(), argv)
    if args.worker is not None:
        memory_worker(args.worker)
        return []
    if args.readme_only:
        results.rewrite_readme_only(readme_blocks(args.docs_dir), args.docs_dir, "bench_rollout*.json")
        return []
    provenance = results.provenance(__file__, argv)  # the code as the run starts
    if args.write_readme:
        if args.tiny or args.accuracy_only:
            raise SystemExit("--write-readme: --tiny and --accuracy-only runs are not README results; drop one")
        base = block_name(args.tag)
        results.check_readme_blocks([base] + ([f"{base}_accuracy"] if args.accuracy_seeds else []))
    threads = args.threads if args.threads is not None else int(os.environ.get("OMP_NUM_THREADS", "1"))
    if threads < 1:
        raise SystemExit(f"--threads={threads}: give at least 1")
    if args.device == "cpu":
        torch.set_num_threads(threads)
    shape = resolve_shape(args)
    names = ["literal", "previous default"] + [n for n, _ in PACKAGE_MODES]
    if args.modes:
        wanted = [m.strip() for m in args.modes.split(",")]
        unknown = [m for m in wanted if m not in names]
        if unknown:
            raise SystemExit(f"--modes: unknown {unknown}; choose from {names}")
        names = [n for n in names if n in wanted or n == "exact"]  # exact is the reference of every ratio
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for case in cases:
        if case not in ("standard", "early EOS"):
            raise SystemExit(f"--cases: unknown {case!r}; choose from 'standard', 'early EOS'")

    if args.accuracy_only:
        accuracy = accuracy_table(args, names)
        for name, values in accuracy.items():
            if values:
                accs = [a for a, _ in values]
                print(f"{name:<28} {sum(accs) / len(accs):.3f}  fwd/compl {sum(f for _, f in values) / len(values):.2f}"
                      f"  per seed {', '.join(f'{a:.3f}' for a in accs)}")  # fmt: skip
        return []
    model = build_model(shape, args.device, args.seed)
    params = parameter_counts(model)
    adapter = as_diffusion_lm(model, eos_token_ids=[EOS_ID], pad_token_id=PAD_ID)
    print(f"shape: {json.dumps(shape)} device={args.device} temperature={args.temperature}")
    rows = []
    for case in cases:
        early = case == "early EOS"
        fn = Timed(adapter, shape, early, args.device)
        ids, mask = make_prompts(shape, early, args.seed)
        ids, mask = ids.to(args.device), mask.to(args.device)
        run_mode(
            "exact",
            fn,
            ids,
            mask,
            dict(shape, steps=shape["gen_length"] // shape["block_length"]),
            args.temperature,
            args.seed,
        )  # fmt: skip  (warm-up)
        outputs = {}
        for name in names:
            fn.seconds = 0.0
            cuda = args.device.startswith("cuda")
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            started = clock(args.device)
            out_ids, out_mask, passes = run_mode(name, fn, ids, mask, shape, args.temperature, args.seed)
            if cuda:
                torch.cuda.synchronize()
            seconds = clock(args.device) - started
            outputs[name] = (out_ids, out_mask)
            rows.append(dict(case=case, mode=name, seconds=seconds, model_seconds=fn.seconds,
                             tokens=int(out_mask.sum()), forward_passes=passes))  # fmt: skip
            if cuda:  # peak memory of this very call, above what was allocated before it
                rows[-1]["peak_mem_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            print(f"  [{case}] {name}: {seconds:.2f} s", flush=True)
        ref_ids, ref_mask = outputs["exact"]
        for row in rows:
            if row["case"] != case:
                continue
            row["match_rate"] = match_rate(*outputs[row["mode"]], ref_ids, ref_mask)
            if "peak_mem_mib" not in row:
                measure = not args.no_memory and case == cases[0]
                row["peak_mem_mib"] = measure_memory(row["mode"], shape, early, args) if measure else None

    for row in rows:
        row["tokens_per_s"] = row["tokens"] / row["seconds"]
        row["overhead"] = (row["seconds"] - row["model_seconds"]) / max(row["model_seconds"], 1e-9)
    by_key = {(r["case"], r["mode"]): r for r in rows}

    accuracy = accuracy_table(args, names) if args.accuracy_seeds else {}
    print()
    header = (f"{'case':<10} {'mode':<28} {'tok/s':>8} {'fwd/compl':>9} {'overhead':>8} {'peak MiB':>9} "
              f"{'x literal':>9} {'x exact':>8} {'match':>6}")  # fmt: skip
    if accuracy:
        header += f" {'accuracy (seeds)':>24}"
    print(header)
    print("-" * len(header))
    for row in rows:
        lit = by_key.get((row["case"], "literal"))
        ex = by_key[(row["case"], "exact")]
        x_lit = f"{row['tokens_per_s'] / lit['tokens_per_s']:.2f}" if lit else "-"
        mem = "-" if row["peak_mem_mib"] is None else f"{row['peak_mem_mib']:.0f}"
        line = (f"{row['case']:<10} {row['mode']:<28} {row['tokens_per_s']:>8.1f} {row['forward_passes']:>9.1f} "
                f"{100 * row['overhead']:>7.1f}% {mem:>9} {x_lit:>9} {row['tokens_per_s'] / ex['tokens_per_s']:>8.2f} "
                f"{row['match_rate']:>6.3f}")  # fmt: skip
        print(line)
    if accuracy:
        exact_acc = [a for a, _ in accuracy["exact"]]
        exact_mean = sum(exact_acc) / len(exact_acc)
        print(f"\nheld-out digit-task accuracy, tiny SFT model per seed ({args.accuracy_seeds}), greedy, gen 8, "
              f"blocks of 4, 8 steps, {args.accuracy_rows} test rows:")  # fmt: skip
        print(f"{'mode':<28} {'accuracy':>8} {'vs exact':>9} {'fwd/compl':>9}  per seed")
        for name, values in accuracy.items():
            if not values:
                continue
            accs = [a for a, _ in values]
            mean = sum(accs) / len(accs)
            fwd = sum(f for _, f in values) / len(values)
            print(f"{name:<28} {mean:>8.3f} {100 * (mean - exact_mean):>+8.1f}pt {fwd:>9.2f}  "
                  f"{', '.join(f'{a:.3f}' for a in accs)}")  # fmt: skip
            for row in rows:
                if row["mode"] == name and row["case"] == cases[0]:
                    row["accuracy"] = accs
    for case in cases:
        prev, ex = by_key.get((case, "previous default")), by_key[(case, "exact")]
        if prev:
            print(f"[{case}] exact vs previous default: {ex['tokens_per_s'] / prev['tokens_per_s']:.2f}x", end="")
            if prev.get("peak_mem_mib") and ex.get("peak_mem_mib") is not None:
                print(f", peak memory {ex['peak_mem_mib'] / prev['peak_mem_mib']:.2f}x", end="")
            print()

    if args.memory_vocab:
        mem_shape = dict(shape, vocab_size=args.memory_vocab)
        print(f"\npeak sampler memory at vocab {args.memory_vocab} (standard case):")
        mem_model = build_model(mem_shape, args.device, args.seed) if args.device.startswith("cuda") else None
        fn = ids = mask = None
        if mem_model is not None:
            del model
            fn = Timed(as_diffusion_lm(mem_model, eos_token_ids=[EOS_ID], pad_token_id=PAD_ID), mem_shape, False,
                       args.device)  # fmt: skip
            ids, mask = (t.to(args.device) for t in make_prompts(mem_shape, False, args.seed))
        mems = {}
        for name in ("previous default", "exact", "dual cache"):
            mems[name] = measure_memory(name, mem_shape, False, args, fn, ids, mask)
            print(f"  {name:<20} {mems[name]:>9.0f} MiB")
            rows.append(dict(case=f"memory vocab {args.memory_vocab}", mode=name, peak_mem_mib=mems[name]))
        if mems["previous default"] > 0:
            print(f"  exact / previous default: {mems['exact'] / mems['previous default']:.3f}")

    if args.json:
        keep = ("case", "mode", "tokens_per_s", "forward_passes", "peak_mem_mib", "match_rate", "overhead", "accuracy")
        with open(args.json, "w") as f:
            json.dump([{k: r[k] for k in keep if k in r} for r in rows], f, indent=2)
        print(f"wrote {args.json}")
    if args.write_readme:
        data = {
            "provenance": provenance,
            "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "write_readme", "readme_only",
                                                                          "docs_dir", "json")},
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            "threads": torch.get_num_threads(),
            "shape": shape,
            "parameters": params,
            "targets": TARGETS,
            "rows": [r for r in rows if r["case"] in cases],
            "memory_vocab": ({"vocab_size": args.memory_vocab, "peak_mem_mib": mems} if args.memory_vocab else None),
            "accuracy": accuracy_record(args, accuracy) if accuracy else None,
        }  # fmt: skip
        path = os.path.join(args.docs_dir, f"{block_name(args.tag)}.json")
        results.write_json(path, data)
        blocks = render_blocks(data, block_name(args.tag))
        results.write_readme_blocks(blocks)
        print(f"wrote {path} and its page's blocks {', '.join(blocks)}")
    return rows


def parameter_counts(model) -> dict:
    """{"head": output-head parameters, "layers": transformer-layer parameters} of an LLaDA model."""
    head = sum(p.numel() for n, p in model.named_parameters() if n.startswith("lm_head."))
    layers = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n)
    return {"head": head, "layers": layers}


def accuracy_record(args, accuracy: dict) -> dict:
    """The accuracy table as JSON: the decode, the SFT models and, per mode, accuracy and forwards per seed."""
    return {
        "seeds": [int(x) for x in args.accuracy_seeds.split(",") if x.strip()],
        "rows": args.accuracy_rows,
        "decode": ACCURACY_DECODE,
        "sft": ACCURACY_SFT,
        "modes": {name: {"accuracy": [a for a, _ in v], "forwards": [f for _, f in v]}
                  for name, v in accuracy.items() if v},
    }  # fmt: skip


# --- README rendering: from the JSON alone ------------------------------------------------------------------------


def block_name(tag: str | None) -> str:
    return "bench_rollout" if not tag else f"bench_rollout_{tag}"


def _target(value: float, target: float | None, at_most: bool = False, fmt: str = "{:g}x") -> str:
    """ "target at least 1.3x: met" (or "... not met"); "" without a target."""
    if target is None:
        return ""
    met = value <= target if at_most else value >= target
    return f"target {'at most' if at_most else 'at least'} {fmt.format(target)}: {'met' if met else 'not met'}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _paren(text: str) -> str:
    return f" ({text})" if text else ""


def render_speed(data: dict) -> str:
    """The speed block: the setting, one table row per (case, mode), and the ratios against their targets."""
    sh, rows, targets = data["shape"], data["rows"], data["targets"]
    cpu = data["device"] == "cpu"
    clock_name = (f"{_count(data['threads'], 'thread')}, CPU time of the process" if cpu
                  else "wall-clock seconds after synchronising")  # fmt: skip
    text = (
        f"A random LLaDA-architecture model (d_model {sh['d_model']}, {sh['n_layers']} layers, {sh['n_heads']} heads, "
        f"MLP {sh['mlp']}, vocab {sh['vocab_size']}, {sh['dtype']}), batch {sh['batch_size']}, prompts of "
        f"{sh['prompt_length']} tokens, {sh['gen_length']} generated tokens, block {sh['block_length']}, "
        f"{sh['steps']} steps, temperature {data['settings']['temperature']:g}; {data['device']}, {clock_name}.\n\n"
    )
    by_key = {(r["case"], r["mode"]): r for r in rows}
    table = []
    for r in rows:
        lit, ex = by_key.get((r["case"], "literal")), by_key[(r["case"], "exact")]
        mem = r.get("peak_mem_mib")
        table.append([
            r["case"], r["mode"], f"{r['tokens_per_s']:.1f}", f"{r['forward_passes']:.0f}", f"{100 * r['overhead']:.1f}%",
            "-" if mem is None else f"{mem:.0f}", f"{r['tokens_per_s'] / lit['tokens_per_s']:.2f}" if lit else "-",
            f"{r['tokens_per_s'] / ex['tokens_per_s']:.2f}", f"{r['match_rate']:.3f}",
        ])  # fmt: skip
    header = ["case", "mode", "tokens/s", "forwards / completion", "overhead", "peak MiB", "x literal", "x exact",
              "match"]  # fmt: skip
    text += results.markdown_table(header, table) + "\n"
    lines = []
    cases = list(dict.fromkeys(r["case"] for r in rows))
    for case in cases:
        ex, prev, lit = (by_key.get((case, m)) for m in ("exact", "previous default", "literal"))
        parts = []
        if prev:
            ratio = ex["tokens_per_s"] / prev["tokens_per_s"]
            parts.append(f"{ratio:.2f}x the previous default"
                         + _paren(_target(ratio, targets["exact_vs_previous_default"].get(case))))  # fmt: skip
        if lit:
            parts.append(f"{ex['tokens_per_s'] / lit['tokens_per_s']:.2f}x LLaDA's literal loop")
        if parts:
            lines.append(f"- {case}: `exact` is {' and '.join(parts)}.")
    exact_rows = [r for r in rows if r["mode"] not in APPROXIMATE]
    differing = [f"{r['case']} / {r['mode']}" for r in exact_rows if r["match_rate"] != 1.0]
    if len(exact_rows) > len(cases):
        lines.append("- The exact rows decode the same tokens as `exact` at temperature 0: "
                     + ("all of them (match 1.000)." if not differing else f"not {', '.join(differing)}."))  # fmt: skip
    ex = by_key[(cases[0], "exact")]
    lines.append(f"- Sampler overhead of `exact` ({cases[0]}): {100 * ex['overhead']:.1f}% of the model's forwards"
                 + _paren(_target(ex["overhead"], targets["exact_overhead"], at_most=True, fmt="{:.0%}")) + ".")  # fmt: skip
    memory = data.get("memory_vocab")
    if memory:
        m = memory["peak_mem_mib"]
        ratio = m["exact"] / m["previous default"]
        lines.append(
            f"- Peak sampler memory at vocabulary {memory['vocab_size']} (same shape otherwise, standard case): "
            f"previous default {m['previous default']:.0f} MiB, exact {m['exact']:.0f} MiB ({ratio:.2f}x; "
            + _target(ratio, targets["exact_vs_previous_default_memory"], at_most=True)
            + f"), dual cache {m['dual cache']:.0f} MiB."
        )
    approx = [(mode, by_key[(cases[0], mode)]) for mode in ("prefix cache", "dual cache", "threshold 0.9",
                                                            "dual cache + threshold 0.9") if (cases[0], mode) in by_key]  # fmt: skip
    if approx:
        parts = []
        for mode, r in approx:
            ratio = r["tokens_per_s"] / ex["tokens_per_s"]
            parts.append(f"{mode} {ratio:.2f}x" + _paren(_target(ratio, targets["vs_exact"].get(mode))))
        lines.append(f"- Approximate modes against `exact` ({cases[0]}): {', '.join(parts)}.")
    p = data["parameters"]
    lines.append(f"- Output head: {p['head'] / 1e6:.1f}M parameters, {p['head'] / p['layers']:.1f}x the "
                 f"{p['layers'] / 1e6:.1f}M of the transformer layers.")  # fmt: skip
    return text + "\n".join(lines) + "\n\n" + results.provenance_line(data)  # a blank line ends the list


def render_accuracy(data: dict) -> str:
    """The accuracy block: the setting, per mode the mean accuracy over seeds, its difference to `exact`, forwards
    per completion and the per-seed values, then the threshold's saving and the caches' spread in one sentence."""
    acc = data["accuracy"]
    d, sft = acc["decode"], acc["sft"]
    seeds = ", ".join(str(x) for x in acc["seeds"])
    text = (
        f"The tiny LLaDA of `configs/tiny.yaml` after its SFT warm-up ({sft['max_steps']} steps), one model per seed "
        f"({seeds}); {acc['rows']} held-out {sft['task']} prompts, greedy, {d['max_completion_length']} tokens in "
        f"blocks of {d['block_length']}, {d['diffusion_steps']} steps.\n\n"
    )
    modes = acc["modes"]

    def mean(values):
        return sum(values) / len(values)

    exact = mean(modes["exact"]["accuracy"])
    exact_fwd = mean(modes["exact"]["forwards"])
    table = []
    for name, v in modes.items():
        a = mean(v["accuracy"])
        table.append([name, f"{a:.3f}", "" if name == "exact" else f"{100 * (a - exact):+.1f} pt",
                      f"{mean(v['forwards']):.2f}", ", ".join(f"{x:.3f}" for x in v["accuracy"])])  # fmt: skip
    text += results.markdown_table(
        [
            "mode",
            f"accuracy (mean of {_count(len(acc['seeds']), 'seed')})",
            "vs exact",
            "forwards / completion",
            "per seed",
        ],
        table,
    )
    sentences = []
    for name in ("threshold 0.9", "dual cache + threshold 0.9"):
        if name in modes:
            saved = 1 - mean(modes[name]["forwards"]) / exact_fwd
            delta = 100 * (mean(modes[name]["accuracy"]) - exact)
            sentences.append(f"{name}: {delta:+.1f} pt with {100 * saved:.0f}% fewer forwards than `exact`")
    caches = [100 * (mean(modes[n]["accuracy"]) - exact) for n in ("prefix cache", "dual cache") if n in modes]
    if caches:
        sentences.append(f"the caches alone: {min(caches):+.1f} to {max(caches):+.1f} pt")
    if sentences:
        text += "\n" + "; ".join(sentences) + ".\n"
    return text + results.provenance_line(data)


def render_blocks(data: dict, name: str) -> dict[str, str]:
    blocks = {name: render_speed(data)}
    if data.get("accuracy"):
        blocks[f"{name}_accuracy"] = render_accuracy(data)
    return blocks


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """The blocks of every docs_dir/bench_rollout[_<tag>].json: bench_rollout[_<tag>] and, where the run measured
    accuracy, bench_rollout[_<tag>]_accuracy."""
    if not os.path.isdir(docs_dir):
        return {}
    blocks = {}
    for file in sorted(os.listdir(docs_dir)):
        if file == "bench_rollout.json" or (file.startswith("bench_rollout_") and file.endswith(".json")):
            blocks.update(render_blocks(results.read_json(os.path.join(docs_dir, file)), file[: -len(".json")]))
    return blocks


if __name__ == "__main__":
    main()
