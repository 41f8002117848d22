"""The memory planner (`stabledrl_trl.memory_plan`) against measured peaks: two StableDRL steps on the CPU, several
shapes, full fine-tuning and LoRA, each in a fresh process.

Every case builds a random LLaDA-architecture model locally (float32, no hub) and trains it for two optimiser steps
with `StableDRLTrainer` (AdamW, the second step runs with the optimizer moments already allocated, as every later
step on a GPU does). Memory is measured as in scripts/bench_memory.py: the growth of the process's peak resident set
size (`ru_maxrss`) from just before the model is built to the end of training, in a fresh process with a fixed
glibc mmap threshold (MALLOC_MMAP_THRESHOLD_=65536) so that freed tensors go back to the system. The planner gets
the same shape and settings (one device, DDP sharding, float32, SDPA without attention matrices) and its estimate is
compared with the measurement. The runtime's own memory on this path (trainer, tokenizer, datasets, thread pools) is
measured once the same way with a tiny model (d_model 64, one layer, vocabulary 256) and given to the planner as
its `overhead_bytes`. Prints the table (error = estimate / measured - 1).

    nice python scripts/bench_plan.py --write-readme       # every case; writes docs/bench_plan.json and the README
    nice python scripts/bench_plan.py --cases "full d512x4,LoRA r64 d768x6"   # some cases, printed only
    python scripts/bench_plan.py --readme-only             # README.md's block from docs/bench_plan.json

`--write-readme` writes the run (the cases' settings, the measured overhead, one row per case, provenance: commit,
command, versions) to `<docs-dir>/bench_plan.json` and rewrites README.md's `bench_plan` block from that file alone
(`readme_blocks`): the overhead, the table, the range of the errors and the command with its commit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from pathlib import Path

try:
    import stabledrl_trl  # noqa: F401
except ImportError:  # run from a checkout without installing: the package sits next to scripts/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stabledrl_trl import results  # noqa: E402
from stabledrl_trl.cli_checks import parse_checked  # noqa: E402
from stabledrl_trl.memory_plan import ModelShape, PlanSettings, estimate  # noqa: E402
from stabledrl_trl.worker_process import run_worker  # noqa: E402

BLOCK = "bench_plan"

# name -> shape and settings; prompt = P characters of the char-level tokenizer (no chat template), so L = P + C.
CASES = {
    "full d512x4": dict(d=512, layers=4, heads=8, mlp=1408, vocab=8192, P=64, C=64, G=4, mc=2, chunk=4, gc=False,
                         lora=0),
    "full d512x4 gc": dict(d=512, layers=4, heads=8, mlp=1408, vocab=8192, P=64, C=64, G=4, mc=2, chunk=4, gc=True,
                             lora=0),
    "full d768x6 gc": dict(d=768, layers=6, heads=12, mlp=2048, vocab=4096, P=64, C=128, G=4, mc=2, chunk=4,
                             gc=True, lora=0),
    "full d256x4 long": dict(d=256, layers=4, heads=4, mlp=704, vocab=16384, P=128, C=256, G=4, mc=2, chunk=8,
                               gc=False, lora=0),
    "LoRA r64 d768x6": dict(d=768, layers=6, heads=12, mlp=2048, vocab=4096, P=64, C=128, G=4, mc=2, chunk=4,
                             gc=False, lora=64),
    "LoRA r16 d256x4 rollout": dict(d=256, layers=4, heads=4, mlp=704, vocab=32768, P=64, C=64, G=16, mc=1, chunk=1,
                                    gc=True, lora=16),
    "LoRA r16 d1024x4 gc": dict(d=1024, layers=4, heads=16, mlp=2816, vocab=8192, P=64, C=128, G=8, mc=2, chunk=4,
                                  gc=True, lora=16),
}  # fmt: skip
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated case names (default: all)")
    p.add_argument("--docs-dir", default=results.DOCS, help="where --write-readme writes bench_plan.json")
    p.add_argument("--write-readme", action="store_true",
                   help="write <docs-dir>/bench_plan.json and the bench_plan block (docs/*.md) from it")  # fmt: skip
    p.add_argument("--readme-only", action="store_true",
                   help="measure nothing: rewrite the block (docs/*.md) from <docs-dir>/bench_plan.json")  # fmt: skip
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: measure one case, print JSON
    return p


# The runtime's own memory on this path (trainer, tokenizer, datasets, thread pools): measured with a tiny model.
BASELINE = dict(CASES["full d512x4"], d=64, layers=1, heads=4, mlp=128, vocab=256)


def case_settings(c: dict, overhead: float = 0.0) -> tuple[ModelShape, PlanSettings]:
    shape = ModelShape(c["d"], c["layers"], c["heads"], c["heads"], c["mlp"], c["vocab"])
    settings = PlanSettings(
        gpus=1, sharding="ddp", bf16=False, use_peft=bool(c["lora"]), lora_r=c["lora"] or 16,
        lora_target_modules=LORA_TARGETS, gradient_checkpointing=c["gc"], per_device_train_batch_size=c["G"],
        steps_per_generation=1, mc_samples=c["mc"], estimator_chunk_size=c["chunk"], max_prompt_length=c["P"],
        max_completion_length=c["C"], block_length=min(32, c["C"]), overhead_bytes=overhead,
    )  # fmt: skip
    return shape, settings


def measure(c: dict) -> int:
    """Peak RSS growth (bytes) of building the model and training it for two steps, in this process."""
    import torch
    from datasets import Dataset

    from stabledrl_trl import StableDRLConfig, StableDRLTrainer
    from stabledrl_trl.models.llada import LLaDAConfig, LLaDAModelLM
    from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict

    torch.set_num_threads(1)
    tokenizer = build_tiny_tokenizer()
    config = LLaDAConfig(**tiny_llada_config_dict(
        d_model=c["d"], n_layers=c["layers"], n_heads=c["heads"], n_kv_heads=c["heads"], mlp_hidden_size=c["mlp"],
        vocab_size=c["vocab"], embedding_size=c["vocab"], max_sequence_length=4096,
    ))  # fmt: skip
    prompts = [{"prompt": "".join(str((i * 7 + j) % 10) for j in range(c["P"]))} for i in range(16)]

    def reward(prompts, completions, **kwargs):
        return [sum(ch.isdigit() for ch in t) / 8.0 + 0.01 * i for i, t in enumerate(completions)]

    peft_config = None
    if c["lora"]:
        from peft import LoraConfig

        peft_config = LoraConfig(r=c["lora"], lora_alpha=2 * c["lora"], target_modules=LORA_TARGETS,
                                 task_type="CAUSAL_LM")  # fmt: skip
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    with tempfile.TemporaryDirectory() as out:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = LLaDAModelLM(config)
        args = StableDRLConfig(
            output_dir=out, use_cpu=True, bf16=False, report_to="none", temperature=1.0,
            gradient_checkpointing=c["gc"], estimator_chunk_size=c["chunk"], per_device_train_batch_size=c["G"],
            num_generations=c["G"], gradient_accumulation_steps=1, mc_samples=c["mc"],
            max_completion_length=c["C"], block_length=min(32, c["C"]), diffusion_steps=min(32, c["C"]) // 2 * 2,
            max_steps=2, learning_rate=1e-5, logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
        )  # fmt: skip
        trainer = StableDRLTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(prompts),
                                   processing_class=tokenizer, peft_config=peft_config)  # fmt: skip
        trainer.train()
        return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * scale


def measure_in_subprocess(name: str) -> int:
    cmd = [sys.executable, __file__, "--worker", name]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "65536"),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    out = run_worker(cmd, env, f"case {name!r}")  # its error, not a bare CalledProcessError
    return json.loads(out.strip().splitlines()[-1])["peak_bytes"]


def run_case(name: str, overhead: float) -> dict:
    measured = measure_in_subprocess(name)
    shape, settings = case_settings(CASES[name], overhead)
    plan = estimate(shape, settings)
    return {
        "case": name,
        "parameters": shape.num_parameters(),
        "measured_mib": measured / 2**20,
        "estimate_mib": plan["peak"] / 2**20,
        "error": plan["peak"] / measured - 1,
        "phase": plan["phase"],
        "overhead_mib": overhead / 2**20,
        "components_mib": {k: v / 2**20 for k, v in plan.items() if k not in ("peak", "phase") and v},
    }


def format_markdown(rows: list[dict]) -> str:
    """The table: one row per case (parameters, measured and estimated peak, error, the estimate's peak phase)."""
    table = [
        [r["case"], f"{r['parameters'] / 1e6:.1f}M", f"{r['measured_mib']:.0f}", f"{r['estimate_mib']:.0f}",
         f"{100 * r['error']:+.1f}%", r["phase"]]
        for r in rows
    ]  # fmt: skip
    header = ["case", "parameters", "measured peak (MiB)", "estimate (MiB)", "error", "peak phase (estimate)"]
    return results.markdown_table(header, table).rstrip("\n")


# --- README rendering: from the JSON alone ------------------------------------------------------------------------


def render(data: dict) -> str:
    """The README block: the runtime overhead measured with the tiny model, the table, the range of the errors over
    the cases, and the provenance line."""
    rows, tiny = data["rows"], data["baseline"]
    errors = [r["error"] for r in rows]
    low, high = min(errors), max(errors)
    low_case = rows[errors.index(low)]["case"]
    high_case = rows[errors.index(high)]["case"]
    worst = max(abs(e) for e in errors)
    return (
        f"Runtime overhead, measured with a tiny model (d_model {tiny['d']}, {tiny['layers']} "
        f"layer{'s' if tiny['layers'] != 1 else ''}, vocabulary {tiny['vocab']}) and given to the planner: "
        f"{data['overhead_mib']:.1f} MiB. Error = estimate / measured - 1.\n\n"
        + format_markdown(rows)
        + f"\n\nOver the {len(rows)} cases the error runs from {100 * low:+.1f}% ({low_case}) to {100 * high:+.1f}% "
        f"({high_case}); the largest |error| is {100 * worst:.1f}%.\n" + results.provenance_line(data)
    )


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{"bench_plan": the block rendered from docs_dir/bench_plan.json} ({} when the file is absent)."""
    path = os.path.join(docs_dir, f"{BLOCK}.json")
    return {BLOCK: render(results.read_json(path))} if os.path.isfile(path) else {}


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = make_parser()
    a = parse_checked(parser, argv)
    if a.worker is not None:
        if a.worker != "baseline" and a.worker not in CASES:
            parser.error(f"--worker {a.worker!r}: invalid choice; give 'baseline' or a case of {list(CASES)}")
        print(json.dumps({"peak_bytes": measure(BASELINE if a.worker == "baseline" else CASES[a.worker])}))
        return []
    if a.readme_only:
        results.rewrite_readme_only(readme_blocks(a.docs_dir), a.docs_dir, f"{BLOCK}.json")
        return []
    provenance = results.provenance(__file__, argv)  # the code as the run starts
    names = [n.strip() for n in a.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        what = f"unknown {unknown}" if unknown else f"no case in {a.cases!r}"
        parser.error(f"--cases: {what}; give comma-separated names from {list(CASES)}")
    if a.write_readme:
        results.check_readme_blocks([BLOCK])
    overhead = measure_in_subprocess("baseline")
    print(f"runtime overhead (tiny model, same run): {overhead / 2**20:.1f} MiB", flush=True)
    rows = []
    for name in names:
        rows.append(run_case(name, overhead))
        print(json.dumps(rows[-1]), flush=True)
    print(format_markdown(rows))
    if a.write_readme:
        data = {
            "provenance": provenance,
            "settings": {
                "cases": {n: CASES[n] for n in names},
                "lora_target_modules": LORA_TARGETS,
                "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_", "65536"),
                "threads": 1,
                "optimizer_steps": 2,
            },
            "baseline": BASELINE,
            "overhead_mib": overhead / 2**20,
            "rows": rows,
        }
        path = os.path.join(a.docs_dir, f"{BLOCK}.json")
        results.write_json(path, data)
        results.write_readme_blocks(readme_blocks(a.docs_dir))
        print(f"wrote {path} and its page's {BLOCK} block")
    return rows


if __name__ == "__main__":
    main()
