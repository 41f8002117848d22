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

from stabledrl_trl import StableDRLConfig, StableDRLTrainer
from stabledrl_trl.models.llada import LLaDAConfig, LLaDAModelLM
from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict

PHASES = ("rollout", "old-policy scoring", "forward", "backward", "optimizer")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--mlp", type=int, default=None, help="MLP width (default 2.75 x d_model)")
    p.add_argument("--vocab-size", type=int, default=101, help="embedding rows (>= the tiny tokenizer's 101)")
    p.add_argument("--bf16", action="store_true", help="bf16 weights and autocast (GPU)")
    p.add_argument("--lora", action="store_true",
                   help="LoRA as configs/llada_gsm8k_lora.yaml: r 128, alpha 64, dropout 0.05, all linear layers")
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
    return p


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
    a = make_parser().parse_args(argv)
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
        peft_config = LoraConfig(r=128, lora_alpha=64, lora_dropout=0.05, target_modules=targets, task_type="CAUSAL_LM")
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
    return shares


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
