"""Peak memory and time of one likelihood estimate (forward + backward) against the number of Monte-Carlo samples K.

The estimators run the K masked copies of every row as (B*K, P+C) rows in chunks of `--chunk-size` rows; with
gradients on and more than one chunk, each chunk runs under activation checkpointing, so only the chunk's small
outputs are kept and activations are recomputed chunk by chunk in backward. Raising K should then raise time roughly
linearly and peak memory hardly at all. This script measures that on a small LLaDA-architecture model built locally
(random weights, no download) and prints, for K = 1, 2, 4, 8 (`--samples`), peak memory and time with ratios vs K=1.

Model: `stabledrl_trl.models.llada.LLaDAModelLM` (the package's bidirectional Llama), built from
`tiny_llada_config_dict` with the sizes given here. If that import fails, a local stand-in is used instead and the
table says so: a stack of bidirectional pre-norm transformer blocks of the same sizes (same activation pattern, not
LLaDA's exact layers).

Memory: on CUDA, `torch.cuda.max_memory_allocated` above what was allocated before the estimate (in process, peak
statistics reset per K). On CPU there is no allocator statistic, so every K runs in a fresh subprocess that reports
the growth of its peak resident set size (`resource.getrusage(...).ru_maxrss`) from just before the estimate to just
after backward; the model and batch are built before the first reading, so the growth is the activations, logits and
gradients. The subprocess runs with a fixed glibc mmap threshold (MALLOC_MMAP_THRESHOLD_=65536) so that freed large
tensors go back to the system and the RSS peak follows the live tensors; it stays coarse (page granularity).
`--chunk-size 0` runs all B*K rows in one pass (no checkpointing); with a chunk size, every K is also measured that
way (`--no-unchunked` skips it), so the table shows both: unchunked, memory grows with K.

Time is wall-clock seconds (`time.perf_counter`), so other load on a shared machine moves it; memory is not moved.

    python scripts/bench_memory.py --batch-size 4 --chunk-size 4 --samples 1,2,4,8 --threads 1 --write-readme
    python scripts/bench_memory.py --readme-only        # README.md's block from docs/bench_memory.json

`--write-readme` writes the results (settings, rows, provenance: commit, command, versions) to
`<docs-dir>/bench_memory.json` and rewrites README.md's `bench_memory` block from that file (`readme_blocks`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import torch
from torch import nn

try:
    import stabledrl_trl  # noqa: F401
except ImportError:  # run from a checkout without installing: the package sits next to scripts/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stabledrl_trl import results  # noqa: E402
from stabledrl_trl.cli_checks import parse_checked  # noqa: E402
from stabledrl_trl.worker_process import run_worker  # noqa: E402

BLOCK = "bench_memory"


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda[:i]")
    p.add_argument("--estimator", default="block_random", help="likelihood estimator name (see ESTIMATORS)")
    p.add_argument("--samples", default="1,2,4,8", help="comma-separated values of K (num_samples)")
    p.add_argument("--batch-size", type=int, default=4, help="completions per estimate (rows B)")
    p.add_argument("--chunk-size", type=int, default=4, help="rows per forward pass; 0 = all B*K rows at once")
    p.add_argument("--prompt-length", type=int, default=64)
    p.add_argument("--completion-length", type=int, default=256)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--repeats", type=int, default=2, help="timed repetitions after one warm-up (time = mean; 0 = the warm-up)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (None keeps torch's)")
    p.add_argument(
        "--unchunked", action=argparse.BooleanOptionalAction, default=True,
        help="with --chunk-size > 0, also measure every K with all rows in one pass (the comparison column)",
    )  # fmt: skip
    p.add_argument("--docs-dir", default=results.DOCS, help="where --write-readme writes bench_memory.json")
    p.add_argument("--write-readme", action="store_true",
                   help="write <docs-dir>/bench_memory.json and the bench_memory block (docs/*.md) from it")  # fmt: skip
    p.add_argument("--readme-only", action="store_true",
                   help="measure nothing: rewrite the block (docs/*.md) from <docs-dir>/bench_memory.json")  # fmt: skip
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # internal: measure one K, print JSON
    return p


# ----------------------------------------------------------------------------------------------------------------------
# Model


class _StandInBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, hidden: int):
        super().__init__()
        self.n_heads = n_heads
        self.attn_norm, self.ff_norm = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, key_mask):
        N, L, D = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(N, L, 3, self.n_heads, D // self.n_heads).unbind(2)
        attn_mask = key_mask[:, None, None, :]  # (N, 1, 1, L): bidirectional, padded keys hidden
        y = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask
        )
        x = x + self.out(y.transpose(1, 2).reshape(N, L, D))
        h = self.ff_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class StandInBidirectionalLM(nn.Module):
    """Local stand-in used only when the package's LLaDA model cannot be imported (see the module docstring)."""

    def __init__(self, vocab: int, d: int, n_layers: int, n_heads: int, hidden: int, max_len: int):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(_StandInBlock(d, n_heads, hidden) for _ in range(n_layers))
        self.norm, self.head = nn.RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids, attention_mask):
        pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (N, L) positions count real tokens
        x = self.emb(input_ids) + self.pos(pos)
        for block in self.blocks:
            x = block(x, attention_mask.bool())
        return self.head(self.norm(x))  # (N, L, V)


def build_model(args):
    """(logits_fn, model, description, mask_token_id)."""
    hidden = 4 * args.d_model
    max_len = args.prompt_length + args.completion_length
    try:
        from stabledrl_trl.models.llada import LLaDAConfig, LLaDAModelLM
        from stabledrl_trl.tiny import tiny_llada_config_dict

        config = LLaDAConfig(
            **tiny_llada_config_dict(
                vocab_size=args.vocab_size,
                d_model=args.d_model,
                n_layers=args.n_layers,
                n_heads=args.n_heads,
                n_kv_heads=args.n_heads,
                mlp_hidden_size=hidden,
                max_sequence_length=max_len,
            )
        )
        model = LLaDAModelLM(config)

        def logits_fn(ids, attn):
            return model(input_ids=ids, attention_mask=attn).logits

        name, mask_id = "LLaDAModelLM (stabledrl_trl.models.llada)", config.mask_token_id
    except ImportError as err:
        model = StandInBidirectionalLM(args.vocab_size, args.d_model, args.n_layers, args.n_heads, hidden, max_len)
        logits_fn, mask_id = model, 1
        name = f"local stand-in bidirectional LM (LLaDA model not importable: {err})"
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype)).train()
    return logits_fn, model, name, mask_id


def make_batch(args, device):
    """Full-length prompts and completions with random tokens (ids >= 2: 0 pad/EOS and 1 mask stay out)."""
    g = torch.Generator().manual_seed(args.seed)
    B, P, C = args.batch_size, args.prompt_length, args.completion_length
    prompt = torch.randint(2, args.vocab_size, (B, P), generator=g).to(device)
    completion = torch.randint(2, args.vocab_size, (B, C), generator=g).to(device)
    return prompt, torch.ones_like(prompt), completion, torch.ones_like(completion)


# ----------------------------------------------------------------------------------------------------------------------
# Measurement


def _step(args, logits_fn, model, batch, mask_id, k, seed):
    from stabledrl_trl.diffusion.estimators import estimate_likelihood

    est = estimate_likelihood(
        args.estimator,
        logits_fn,
        *batch,
        mask_token_id=mask_id,
        seed=seed,
        num_samples=k,
        chunk_size=args.chunk_size or None,
    )
    est.seq_logps.sum().backward()
    model.zero_grad(set_to_none=True)


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def measure(args, k: int) -> dict:
    """Peak memory growth (bytes) and mean time (s) of one estimate + backward at K = k, in this process."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    logits_fn, model, name, mask_id = build_model(args)
    batch = make_batch(args, args.device)
    cuda = str(args.device).startswith("cuda")
    if cuda:
        _sync(args.device)
        torch.cuda.reset_peak_memory_stats(args.device)
        base = torch.cuda.memory_allocated(args.device)
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    _step(args, logits_fn, model, batch, mask_id, k, seed=0)  # warm-up; its peak is the one reported on CPU
    _sync(args.device)
    warm_up = time.perf_counter() - start
    if cuda:
        peak = torch.cuda.max_memory_allocated(args.device) - base
    else:
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * scale
    times = []
    for r in range(args.repeats):
        start = time.perf_counter()
        _step(args, logits_fn, model, batch, mask_id, k, seed=r + 1)
        _sync(args.device)
        times.append(time.perf_counter() - start)
    seconds = sum(times) / len(times) if times else warm_up  # --repeats 0: the warm-up's time
    return {"k": k, "peak_bytes": int(peak), "seconds": seconds, "model": name}


def _measure_in_subprocess(argv: list[str], k: int, chunk_size: int | None = None) -> dict:
    """Measure K = k in a fresh process; `chunk_size` overrides --chunk-size (0: all rows in one pass)."""
    argv = [a for a in argv if a not in ("--write-readme", "--readme-only")]
    if chunk_size is not None:
        argv += ["--chunk-size", str(chunk_size)]  # the last occurrence wins in argparse
    cmd = [sys.executable, __file__, *argv, "--worker", str(k)]
    # A fixed mmap threshold stops glibc from raising it after frees (its default), so large tensors are always
    # mmapped and given back on free: the peak RSS then follows the live tensors instead of heap fragmentation.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "65536")}
    out = run_worker(cmd, env, f"K={k}")  # its error, not a bare CalledProcessError
    return json.loads(out.strip().splitlines()[-1])


def _ratio(value: float, base: float) -> float | None:
    return value / base if base > 0 else None


def format_table(rows: list[dict]) -> str:
    base = rows[0]
    lines = [
        f"{'K':>3} {'peak MiB':>10} {'x K=1':>7} {'time s':>9} {'x K=1':>7}",
        f"{'-' * 3} {'-' * 10} {'-' * 7} {'-' * 9} {'-' * 7}",
    ]
    for r in rows:
        mem_ratio = _ratio(r["peak_bytes"], base["peak_bytes"])
        lines.append(
            f"{r['k']:>3} {r['peak_bytes'] / 2**20:>10.1f} {mem_ratio if mem_ratio is not None else float('nan'):>7.2f} "
            f"{r['seconds']:>9.3f} {r['seconds'] / base['seconds']:>7.2f}"
        )
    return "\n".join(lines)


# --- README rendering: from the JSON alone ------------------------------------------------------------------------


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(data: dict) -> str:
    """The README block: the setting, peak memory and time per K (ratios to K = 1; the unchunked peak when measured),
    the growth from the smallest to the largest K in one sentence, and the provenance line."""
    s, rows = data["settings"], data["rows"]
    cuda = s["device"].startswith("cuda")
    chunk = f"chunks of {s['chunk_size']} rows" if s["chunk_size"] else "all rows in one pass (no chunking)"
    threads = f", {s['threads']} thread{'s' if s['threads'] != 1 else ''}" if s["threads"] else ""
    memory = "CUDA max_memory_allocated growth" if cuda else "peak RSS growth, each K in a fresh process"
    timing = f"mean of {s['repeats']} after a warm-up" if s["repeats"] else "the warm-up's"
    text = (
        f"`{s['estimator']}` estimator, forward + backward, a random {data['model']} (d_model {s['d_model']}, "
        f"{s['n_layers']} layers, {s['n_heads']} heads, vocab {s['vocab_size']}, {s['dtype']}); batch "
        f"{s['batch_size']}, prompt {s['prompt_length']} + completion {s['completion_length']}, {chunk}; "
        f"{s['device']}{threads}. Memory: {memory}; time: wall-clock seconds ({timing}).\n\n"
    )
    unchunked = all("unchunked_peak_bytes" in r for r in rows)
    base = rows[0]
    per = f"x K={base['k']}"
    header = ["K", "peak memory (MiB)", per, "time (s)", per]
    if unchunked:
        header += ["peak without chunking (MiB)", per]
    table = []
    for r in rows:
        row = [
            r["k"],
            f"{r['peak_bytes'] / 2**20:.1f}",
            _x(_ratio(r["peak_bytes"], base["peak_bytes"])),
            f"{r['seconds']:.2f}",
            _x(_ratio(r["seconds"], base["seconds"])),
        ]
        if unchunked:
            row += [
                f"{r['unchunked_peak_bytes'] / 2**20:.1f}",
                _x(_ratio(r["unchunked_peak_bytes"], base["unchunked_peak_bytes"])),
            ]
        table.append(row)
    text += results.markdown_table(header, table)
    last = rows[-1]
    text += (
        f"\nFrom K = {base['k']} to K = {last['k']}: peak memory {_x(_ratio(last['peak_bytes'], base['peak_bytes']))}x "
        f"with {chunk}"
    )
    if unchunked:
        growth = _ratio(last["unchunked_peak_bytes"], base["unchunked_peak_bytes"])
        text += f", {_x(growth)}x without chunking"
    text += f"; time {_x(_ratio(last['seconds'], base['seconds']))}x.\n"
    return text + results.provenance_line(data)


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{"bench_memory": the block rendered from docs_dir/bench_memory.json} ({} when the file is absent)."""
    path = os.path.join(docs_dir, f"{BLOCK}.json")
    return {BLOCK: render(results.read_json(path))} if os.path.isfile(path) else {}


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_checked(make_parser(), argv, zero_ok=("chunk_size", "repeats"))
    if args.worker is not None:
        print(json.dumps(measure(args, args.worker)))
        return []
    if args.readme_only:
        results.rewrite_readme_only(readme_blocks(args.docs_dir), args.docs_dir, f"{BLOCK}.json")
        return []
    provenance = results.provenance(__file__, argv)  # the code as the run starts
    ks = [int(k) for k in args.samples.split(",") if k.strip()]
    if not ks or min(ks) < 1:
        raise ValueError(f"--samples must list positive ints, got {args.samples!r}; e.g. --samples 1,2,4,8")
    if args.chunk_size < 0:
        raise ValueError(f"--chunk-size must be >= 0 (0 = no chunking), got {args.chunk_size}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1 (or left out for torch's default), got {args.threads}")
    cuda = str(args.device).startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device} requested but CUDA is not available; use --device cpu")
    if args.write_readme:
        results.check_readme_blocks([BLOCK])
    unchunked = args.unchunked and args.chunk_size > 0

    def one(k: int, chunk_size: int | None = None) -> dict:
        if not cuda:  # CPU: a fresh process per K so that each reading of the peak RSS starts clean
            return _measure_in_subprocess(argv, k, chunk_size)
        return measure(
            argparse.Namespace(**{**vars(args), **({} if chunk_size is None else {"chunk_size": chunk_size})}), k
        )

    rows = [one(k) for k in ks]
    if unchunked:
        for row in rows:
            alone = one(row["k"], chunk_size=0)
            row.update(unchunked_peak_bytes=alone["peak_bytes"], unchunked_seconds=alone["seconds"])
    chunk = args.chunk_size or "all"
    print(
        f"estimator={args.estimator} device={args.device} dtype={args.dtype} B={args.batch_size} "
        f"P={args.prompt_length} C={args.completion_length} chunk_size={chunk} (forward + backward)\n"
        f"model: {rows[0]['model']}, d_model={args.d_model}, layers={args.n_layers}, vocab={args.vocab_size}\n"
        f"memory: {'CUDA max_memory_allocated growth' if cuda else 'peak RSS growth in a fresh process per K'}"
    )
    print(format_table(rows))
    if unchunked:
        print("\n" + format_table([dict(r, peak_bytes=r["unchunked_peak_bytes"], seconds=r["unchunked_seconds"])
                                    for r in rows]) + "\n(all rows in one pass)")  # fmt: skip
    if args.write_readme:
        settings = {
            k: v for k, v in vars(args).items() if k not in ("worker", "write_readme", "readme_only", "docs_dir")
        }
        settings["device"] = str(args.device)
        model = rows[0]["model"].split(" (")[0]
        data = {"provenance": provenance, "settings": settings, "model": model, "rows": rows}
        path = os.path.join(args.docs_dir, f"{BLOCK}.json")
        results.write_json(path, data)
        results.write_readme_blocks(readme_blocks(args.docs_dir))
        print(f"wrote {path} and its page's {BLOCK} block")
    return rows


if __name__ == "__main__":
    main()
