#!/usr/bin/env bash
# GPU check: what the CPU tests cannot show, in under 10 minutes on one GPU, with no model hub.
#
# At LLaDA-8B's shape with random weights built in bf16 directly on the GPU (d_model 4096, 32 layers, 32 heads,
# MLP 12288, vocab 126464; transformers' SDPA attention):
#   1. rollout throughput, scripts/bench_rollout.py --device cuda: batch 16, prompts of 128 tokens, 256 generated
#      tokens, blocks of 32, 128 steps; every exact and approximate mode (standard case), then the early-EOS case for
#      the previous default, exact and dual cache + threshold: tokens/s, forward passes per completion, peak memory,
#      and the token match of every mode with `exact` (literal LLaDA loop vs exact: the exact sampler's exactness);
#   2. exactness of the cached block-diffusion rollouts on CUDA, scripts/bench_block_cache_exactness.py: SDAR's sampler
#      with its KV cache against the same sampler without it, float32 and bf16 (random SDAR-architecture model);
#   3. one StableDRL step with LoRA and its time split, scripts/bench_step.py: the shape of
#      configs/llada_gsm8k_lora.yaml (LoRA r 128 on all linear layers, gradient checkpointing, 8 completions of 256
#      tokens, block 32, 128 steps, block_random with 2 MC samples, estimator chunks of 4, num_iterations 2; one
#      micro-batch), bf16 with SDPA: phase seconds and shares, rollout tokens/s, loss, peak memory.
# Each part runs under its own time limit (240 + 100 + 60 + 150 s: under 10 minutes in all, start-up included) and a
# failing part does not stop the others. Everything is gathered into one JSON summary, $GPU_CHECK_OUT/summary.json
# (default gpu_check_out/), with each part's status, seconds and results; the exit status is non-zero if a part
# failed or a check did not hold.
#
# Usage: bash scripts/gpu_check.sh          (on a CUDA machine; PYTHON=/path/to/python picks the interpreter)
#        bash scripts/gpu_check.sh --tiny   (tiny shapes on CPU: checks the script itself; tests/scripts/test_gpu_check.py)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${GPU_CHECK_OUT:-gpu_check_out}"
mkdir -p "$OUT"
# The interpreter: $PYTHON (tests pass the one running them), else python / python3 from PATH.
PY="${PYTHON:-$(command -v python || command -v python3 || true)}"
if [[ -z "$PY" ]]; then
  echo "gpu_check.sh: no python on PATH; activate the virtual environment or set PYTHON=/path/to/python" >&2
  exit 2
fi

if [[ "${1:-}" == "--tiny" ]]; then
  MODE=tiny
  export OMP_NUM_THREADS=1
  ROLLOUT=(--device cpu --tiny --no-memory)
  EXACT=(--device cpu --tiny)
  STEP=(--d-model 64 --n-layers 2 --n-heads 4 --vocab-size 512 --completion-length 16 --block-length 8
        --diffusion-steps 8 --num-generations 8 --lora --gradient-checkpointing --estimator-chunk-size 4
        --steps 1 --warmup 0)
  LIMITS=(600 600 600 600)
else
  MODE=gpu
  "$PY" - <<'EOF' || exit 1
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA device visible to torch (use --tiny to check the script on CPU)")
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
  ROLLOUT=(--device cuda)
  EXACT=(--device cuda)
  STEP=(--d-model 4096 --n-layers 32 --n-heads 32 --mlp 12288 --vocab-size 126464 --bf16 --lora
        --gradient-checkpointing --estimator-chunk-size 4 --num-generations 8 --completion-length 256
        --block-length 32 --diffusion-steps 128 --num-iterations 2 --mc-samples 2 --steps 1 --warmup 0)
  LIMITS=(240 100 60 150)
fi

started=$(date +%s)
: > "$OUT/parts.tsv"
part() {  # part NAME LIMIT COMMAND...: run with a time limit, log to $OUT/NAME.log, record status and seconds
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit} s)"
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -v '^{' "$OUT/$name.log" | tail -n 40
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit" >> "$OUT/parts.tsv"
}

part rollout_standard "${LIMITS[0]}" "$PY" scripts/bench_rollout.py "${ROLLOUT[@]}" --cases standard \
  --json "$OUT/rollout_standard.json"
part rollout_early_eos "${LIMITS[1]}" "$PY" scripts/bench_rollout.py "${ROLLOUT[@]}" --cases "early EOS" \
  --modes "previous default,exact,dual cache + threshold 0.9" --json "$OUT/rollout_early_eos.json"
part cache_exactness "${LIMITS[2]}" "$PY" scripts/bench_block_cache_exactness.py "${EXACT[@]}" --json "$OUT/cache_exactness.json"
part lora_step "${LIMITS[3]}" "$PY" scripts/bench_step.py "${STEP[@]}" --json "$OUT/lora_step.json"

"$PY" - "$OUT" "$MODE" "$(( $(date +%s) - started ))" <<'EOF'
import json, math, os, sys

import torch

out, mode, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])


def load(name):
    path = os.path.join(out, name)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


parts = {}
with open(os.path.join(out, "parts.tsv")) as f:
    for line in f:
        name, rc, secs, limit = line.rstrip("\n").split("\t")
        status = "ok" if rc == "0" else ("timed out" if rc == "124" else f"failed (exit {rc})")
        parts[name] = {"status": status, "seconds": int(secs), "limit_seconds": int(limit)}
rollout = (load("rollout_standard.json") or []) + (load("rollout_early_eos.json") or [])
exactness, step = load("cache_exactness.json"), load("lora_step.json")
literal = [r for r in rollout if r.get("mode") == "literal"]
checks = {
    "llada_sampler_exact_equals_literal": bool(literal) and all(r.get("match_rate") == 1.0 for r in literal),
    "cached_block_rollouts_exact_float32": bool(exactness and exactness.get("float32_exact")),
    "lora_step_finite_loss": bool(step and step["loss"] and all(math.isfinite(x) for x in step["loss"])),
    "bf16_sdpa": bool(step and step["dtype"] == "bfloat16" and step["attention"] == "sdpa"),
    "under_10_minutes": seconds < 600,
}
if mode == "tiny":  # float32 on a CPU: the dtype and the time limit are the GPU run's checks
    checks["bf16_sdpa"] = bool(step and step["attention"] == "sdpa")
    del checks["under_10_minutes"]
summary = {
    "mode": mode,
    "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and mode == "gpu" else "cpu",
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "seconds": seconds,
    "parts": parts,
    "checks": checks,
    "rollout_throughput": rollout,
    "cache_exactness": exactness,
    "lora_step": step,
}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
print(f"== summary: {os.path.join(out, 'summary.json')} ({seconds} s)")
for name, ok in checks.items():
    print(f"  {'ok ' if ok else 'NOT'} {name}")
failed = [n for n, p in parts.items() if p["status"] != "ok"] + [n for n, ok in checks.items() if not ok]
sys.exit(1 if failed else 0)
EOF
