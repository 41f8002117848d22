"""Where one StableDRL training step's time goes: rollout, old-policy scoring, forward+backward, optimizer, the rest.

Builds a random LLaDA-architecture model locally (no hub), trains it with `StableDRLTrainer` on a synthetic prompt set
with a cheap reward, and times each phase by wrapping the trainer's own methods:
- rollout: `_generate_single_turn` (the masked-diffusion sampler);
- old-policy scoring: the likelihood estimates made without gradient (`_get_per_token_logps_and_entropies` under
  no_grad: the old policy after generation);
- forward: `compute_loss` (the current policy's estimate with gradient and the objective); backward:
  `accelerator.backward`;
- optimizer: the optimizer's `step` (and gradient clipping happens between backward and step: in "everything else");
- everything else: the step's total minus the above (TRL's tokenisation, rewards, advantages, gathers, logging).
Step totals run from `on_step_begin` to `on_step_end` of a callback; the first `--warmup` steps are not counted.
On CPU the clock is this process's CPU time (one thread), robust to other load on a shared machine.

Usage: nice python scripts/bench_step.py [--completion-length 64] [--rollout-cache dual --parallel-threshold 0.9]

    nice python scripts/bench_step.py --completion-length 128 --diffusion-steps 64 --write-readme
    nice python scripts/bench_step.py --completion-length 128 --diffusion-steps 64 --rollout-cache dual \
        --parallel-threshold 0.9 --write-readme
    python scripts/bench_step.py --readme-only      # README.md's block from docs/bench_step_*.json

`--write-readme` writes the run (settings, phases, provenance: commit, command, versions) to
`<docs-dir>/bench_step_<rollout>.json` (`exact`, or e.g. `dual_cache_threshold_0.9`) and rewrites README.md's
`bench_step` block: one column pair per rollout setting, from every such file (`readme_blocks`; the runs must share
every other setting).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

try:
    import stabledrl_trl  # noqa: F401
except ImportError:  # run from a checkout without installing: the package sits next to scripts/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datasets import Dataset
from transformers import TrainerCallback

from stabledrl_trl import StableDRLConfig, StableDRLTrainer, results
from stabledrl_trl.cli_checks import parse_checked  # noqa: E402
from stabledrl_trl.models.llada import LLaDAConfig, LLaDAModelLM
from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict

PHASES = ("rollout", "old-policy scoring", "forward", "backward", "optimizer")
BLOCK = "bench_step"
ROLLOUT_SETTINGS = ("rollout_cache", "parallel_threshold")  # what the README's columns differ by
NOT_SETTINGS = ("json", "write_readme", "readme_only", "docs_dir")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--mlp", type=int, default=None, help="MLP width (default 2.75 x d_model)")
    p.add_argument("--vocab-size", type=int, default=101, help="embedding rows (>= the tiny tokenizer's 101)")
    p.add_argument("--bf16", action="store_true", help="bf16 weights and autocast (GPU)")
    p.add_argument(
        "--lora",
        action="store_true",
        help="LoRA as configs/llada_gsm8k_lora.yaml: r 128, alpha 64, dropout 0.05, all linear layers",
    )
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--estimator-chunk-size", type=int, default=None)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--completion-length", type=int, default=64)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--diffusion-steps", type=int, default=32)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--num-iterations", type=int, default=2)
    p.add_argument("--mc-samples", type=int, default=2)
    p.add_argument("--rollout-cache", default="none")
    p.add_argument("--parallel-threshold", type=float, default=None)
    p.add_argument("--steps", type=int, default=4, help="timed optimiser steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write the phases, rollout rate and peak memory as JSON here")
    p.add_argument("--docs-dir", default=results.DOCS, help="where --write-readme writes bench_step_<rollout>.json")
    p.add_argument("--write-readme", action="store_true",
                   help="write <docs-dir>/bench_step_<rollout>.json and the bench_step block (docs/*.md)")  # fmt: skip
    p.add_argument("--readme-only", action="store_true",
                   help="measure nothing: rewrite the block (docs/*.md) from the bench_step_*.json files in --docs-dir")  # fmt: skip
    return p


def rollout_label(rollout_cache: str, parallel_threshold: float | None) -> str:
    """The rollout setting's name: "exact", "dual cache", "threshold 0.9", "dual cache + threshold 0.9"."""
    parts = [] if rollout_cache == "none" else [f"{rollout_cache} cache"]
    if parallel_threshold is not None:
        parts.append(f"threshold {parallel_threshold:g}")
    return " + ".join(parts) or "exact"


def json_name(label: str) -> str:
    return f"{BLOCK}_{label.replace(' + ', '_').replace(' ', '_')}.json"


# --- README rendering: from the JSON alone ------------------------------------------------------------------------


def render(runs: list[dict]) -> str:
    """The README block of one or more runs that differ only in the rollout setting: the setting, one column pair
    (seconds per step, share) per run, the rollout's and the rest's shares in one sentence, one provenance line each."""
    base = {k: v for k, v in runs[0]["settings"].items() if k not in ROLLOUT_SETTINGS}
    for run in runs[1:]:
        other = {k: v for k, v in run["settings"].items() if k not in ROLLOUT_SETTINGS}
        if other != base:
            differ = sorted(k for k in set(base) | set(other) if base.get(k) != other.get(k))
            raise ValueError(f"bench_step runs differ in {differ}, not only in the rollout: rerun them alike")
    s, first = runs[0]["settings"], runs[0]
    threads = f", {s['threads']} thread{'s' if s['threads'] != 1 else ''}" if first["device"] == "cpu" else ""
    clock_name = "CPU time of the process" if first["device"] == "cpu" else "wall-clock time"
    text = (
        f"A random LLaDA-architecture model (d_model {s['d_model']}, {s['n_layers']} layers, {s['n_heads']} heads, "
        f"vocabulary {s['vocab_size']}, {first['dtype']}); G = {s['num_generations']}, completions of "
        f"{s['completion_length']} tokens, block {s['block_length']}, {s['diffusion_steps']} steps, "
        f"{first['likelihood_estimator']} with {s['mc_samples']} MC samples, num_iterations {s['num_iterations']}; "
        f"{s['steps']} timed steps after {s['warmup']} warm-up; {first['device']}{threads}, {clock_name}.\n\n"
    )
    labels = [rollout_label(r["settings"]["rollout_cache"], r["settings"]["parallel_threshold"]) for r in runs]
    header = ["phase"]
    for label in labels:
        header += [f"{label}: s / step", "share"]
    table = []
    for phase in (*PHASES, "everything else"):
        row = [phase]
        for r in runs:
            row += [f"{r['seconds_per_step'][phase]:.3f}", f"{100 * r['shares'][phase]:.1f}%"]
        table.append(row)
    total = ["total"]
    for r in runs:
        total += [f"{r['total_seconds_per_step']:.3f}", ""]
    text += results.markdown_table(header, [*table, total])
    rollout = ", ".join(f"{100 * r['shares']['rollout']:.1f}% ({label})" for r, label in zip(runs, labels))
    rest = ", ".join(f"{100 * r['shares']['everything else']:.1f}%" for r in runs)
    text += f"\nThe rollout takes {rollout} of a step; everything else {rest}.\n"
    if len(runs) > 1:
        text += f"A step takes {runs[0]['total_seconds_per_step'] / runs[-1]['total_seconds_per_step']:.2f}x as long "
        text += f"with {labels[0]} as with {labels[-1]}.\n"
    return text + "".join(results.provenance_line(r) for r in runs)


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{"bench_step": the block rendered from docs_dir/bench_step_*.json, the exact rollout first} ({} if none)."""
    if not os.path.isdir(docs_dir):
        return {}
    names = sorted(n for n in os.listdir(docs_dir) if n.startswith(f"{BLOCK}_") and n.endswith(".json"))
    runs = [results.read_json(os.path.join(docs_dir, n)) for n in names]
    runs.sort(
        key=lambda r: r["settings"]["rollout_cache"] != "none" or r["settings"]["parallel_threshold"] is not None
    )
    return {BLOCK: render(runs)} if runs else {}


def clock() -> float:
    return time.perf_counter() if torch.cuda.is_available() else time.process_time()


class PhaseTimer:
    def __init__(self):
        self.totals = defaultdict(float)
        self.active = False

    def wrap(self, obj, name, phase, when=None):
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            if not self.active or (when is not None and not when()):
                return original(*args, **kwargs)
            started = clock()
            try:
                return original(*args, **kwargs)
            finally:
                self.totals[phase] += clock() - started

        setattr(obj, name, timed)


class StepClock(TrainerCallback):
    def __init__(self, timer: PhaseTimer, warmup: int):
        self.timer, self.warmup, self.step_seconds, self._started = timer, warmup, 0.0, None

    def on_step_begin(self, args, state, control, **kwargs):
        self.timer.active = state.global_step >= self.warmup
        self._started = clock()

    def on_step_end(self, args, state, control, **kwargs):
        if self.timer.active:
            self.step_seconds += clock() - self._started


class TimedTrainer(StableDRLTrainer):
    def create_optimizer(self, *args, **kwargs):
        optimizer = super().create_optimizer(*args, **kwargs)
        self._phase_timer.wrap(optimizer, "step", "optimizer")
        return optimizer


def main(argv=None) -> dict:
    a = parse_checked(make_parser(), argv)
    if a.readme_only:
        results.rewrite_readme_only(readme_blocks(a.docs_dir), a.docs_dir, f"{BLOCK}_*.json")
        return {}
    provenance = results.provenance(__file__, argv)  # the code as the run starts
    if a.write_readme:
        results.check_readme_blocks([BLOCK])
    torch.set_num_threads(a.threads)
    tokenizer = build_tiny_tokenizer()
    config = LLaDAConfig(**tiny_llada_config_dict(
        d_model=a.d_model, n_layers=a.n_layers, n_heads=a.n_heads, n_kv_heads=a.n_heads,
        mlp_hidden_size=a.mlp or int(2.75 * a.d_model), vocab_size=a.vocab_size, embedding_size=a.vocab_size,
        max_sequence_length=4096, rope_theta=500000.0,
    ))  # fmt: skip
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if a.bf16 else torch.float32
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # built in its dtype on the device (an 8B float32 copy would not fit)
        try:
            model = LLaDAModelLM(config)
        finally:
            torch.set_default_dtype(default)
    peft_config = None
    if a.lora:
        from peft import LoraConfig

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        peft_config = LoraConfig(
            r=128, lora_alpha=64, lora_dropout=0.05, target_modules=targets, task_type="CAUSAL_LM"
        )
    prompts = [{"prompt": [{"role": "user", "content": f"sort {i:05d} {i * 7919 % 100000:05d}"}]} for i in range(64)]

    def reward(prompts, completions, **kwargs):
        return [sum(ch.isdigit() for ch in c[-1]["content"]) / 8.0 for c in completions]

    timer = PhaseTimer()
    with tempfile.TemporaryDirectory() as out:
        args = StableDRLConfig(
            output_dir=out, use_cpu=device == "cpu", bf16=a.bf16, report_to="none", temperature=a.temperature,
            gradient_checkpointing=a.gradient_checkpointing, estimator_chunk_size=a.estimator_chunk_size,
            per_device_train_batch_size=a.num_generations, num_generations=a.num_generations,
            gradient_accumulation_steps=1, num_iterations=a.num_iterations, mc_samples=a.mc_samples,
            max_completion_length=a.completion_length, block_length=a.block_length,
            diffusion_steps=a.diffusion_steps, rollout_cache=a.rollout_cache,
            parallel_threshold=a.parallel_threshold, max_steps=a.warmup + a.steps, learning_rate=1e-5,
            logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
        )  # fmt: skip
        TimedTrainer._phase_timer = timer
        clock_cb = StepClock(timer, a.warmup)
        trainer = TimedTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(prompts),
                               processing_class=tokenizer, callbacks=[clock_cb], peft_config=peft_config)  # fmt: skip
        timer.wrap(trainer, "_generate_single_turn", "rollout")
        timer.wrap(trainer, "_get_per_token_logps_and_entropies", "old-policy scoring",
                   when=lambda: not torch.is_grad_enabled())  # fmt: skip
        timer.wrap(trainer, "compute_loss", "forward")
        timer.wrap(trainer.accelerator, "backward", "backward")
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
        logs = [h for h in trainer.state.log_history if "stabledrl/rollout_tokens_per_s" in h]

    total = clock_cb.step_seconds
    measured = {phase: timer.totals[phase] for phase in PHASES}
    rest = total - sum(measured.values())
    print(f"StableDRL training step phases over {a.steps} steps (after {a.warmup} warm-up): d_model {a.d_model}, "
          f"{a.n_layers} layers, completions {a.completion_length}, block {a.block_length}, {a.diffusion_steps} "
          f"steps, G={a.num_generations}, num_iterations {a.num_iterations}, mc_samples {a.mc_samples}, "
          f"rollout_cache={a.rollout_cache}, parallel_threshold={a.parallel_threshold}")  # fmt: skip
    print(f"{'phase':<22} {'seconds/step':>12} {'share':>7}")
    shares = {}
    for phase, seconds in [*measured.items(), ("everything else", rest)]:
        shares[phase] = seconds / total
        print(f"{phase:<22} {seconds / a.steps:>12.3f} {100 * shares[phase]:>6.1f}%")
    print(f"{'total':<22} {total / a.steps:>12.3f} {100.0:>6.1f}%")
    summary = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "dtype": "bfloat16" if a.bf16 else "float32",
        "attention": model.config._attn_implementation,
        "lora": a.lora,
        "likelihood_estimator": args.likelihood_estimator,
        "steps": a.steps,
        "seconds_per_step": {p: s / a.steps for p, s in [*measured.items(), ("everything else", rest)]},
        "total_seconds_per_step": total / a.steps,
        "shares": shares,
        "loss": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    }
    if logs:
        rate = sum(h["stabledrl/rollout_tokens_per_s"] for h in logs) / len(logs)
        passes = sum(h["stabledrl/rollout_forward_passes"] for h in logs) / len(logs)
        summary.update(rollout_tokens_per_s=rate, rollout_forward_passes=passes)
        print(f"rollout: {rate:.1f} tokens/s, {passes:.1f} forward passes per completion (trainer logs)")
    if device == "cuda":
        summary["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        print(f"peak GPU memory of the run: {summary['peak_gib']:.1f} GiB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    if a.write_readme:
        settings = {k: v for k, v in vars(a).items() if k not in NOT_SETTINGS}
        path = os.path.join(a.docs_dir, json_name(rollout_label(a.rollout_cache, a.parallel_threshold)))
        results.write_json(path, {"provenance": provenance, "settings": settings, **summary})
        results.write_readme_blocks(readme_blocks(a.docs_dir))
        print(f"wrote {path} and its page's {BLOCK} block")
    return shares


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
