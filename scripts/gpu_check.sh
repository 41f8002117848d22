#!/usr/bin/env bash
# GPU check of fast rollouts and one LoRA training step at LLaDA-8B's shape, with no model hub.
#
# Builds LLaDA-8B-shaped random weights in bf16 directly on the GPU (d_model 4096, 32 layers, 32 heads, MLP 12288,
# vocab 126464), then
#   1. scripts/bench_rollout.py --device cuda: batch 16, prompts of 128 tokens, 256 generated tokens, blocks of 32,
#      128 steps; every exact and approximate mode (standard case), and the early-EOS case for the previous default,
#      exact and dual cache + threshold: tokens/s, forward passes per completion, peak memory;
#   2. scripts/bench_step.py: one StableDRL step in the shape of configs/llada_gsm8k_lora.yaml (LoRA r 128 on all
#      linear layers, gradient checkpointing, 8 completions of 256 tokens, block 32, 128 steps, block_random with 2 MC
#      samples, estimator chunks of 4, num_iterations 2; one micro-batch: gradient accumulation 1), printing the
#      phase shares, rollout tokens/s and peak memory.
# Expected under 8 minutes on one H100 / H200. Outputs (JSON, logs) go to $GPU_CHECK_OUT (default gpu_check_out/).
#
# Usage: bash scripts/gpu_check.sh          (on a CUDA machine)
#        bash scripts/gpu_check.sh --tiny   (tiny shapes on CPU, seconds: checks the script itself)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${GPU_CHECK_OUT:-gpu_check_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"

if [[ "${1:-}" == "--tiny" ]]; then
  export OMP_NUM_THREADS=1
  ROLLOUT=(--device cpu --tiny --no-memory)
  STEP=(--d-model 64 --n-layers 2 --n-heads 4 --vocab-size 512 --completion-length 16 --block-length 8
        --diffusion-steps 8 --num-generations 8 --lora --gradient-checkpointing --estimator-chunk-size 4
        --steps 1 --warmup 0)
  LIMIT=300
else
  "$PY" - <<'EOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA device visible to torch (use --tiny to check the script on CPU)")
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
  ROLLOUT=(--device cuda)
  STEP=(--d-model 4096 --n-layers 32 --n-heads 32 --mlp 12288 --vocab-size 126464 --bf16 --lora
        --gradient-checkpointing --estimator-chunk-size 4 --num-generations 8 --completion-length 256
        --block-length 32 --diffusion-steps 128 --num-iterations 2 --mc-samples 2 --steps 1 --warmup 0)
  LIMIT=420
fi

started=$(date +%s)
echo "== rollout benchmark, standard case, every mode"
timeout "$LIMIT" "$PY" scripts/bench_rollout.py "${ROLLOUT[@]}" --cases standard --json "$OUT/rollout_standard.json" \
  2>&1 | tee "$OUT/rollout_standard.log"
echo "== rollout benchmark, early-EOS case"
timeout "$LIMIT" "$PY" scripts/bench_rollout.py "${ROLLOUT[@]}" --cases "early EOS" \
  --modes "previous default,exact,dual cache + threshold 0.9" --json "$OUT/rollout_early_eos.json" \
  2>&1 | tee "$OUT/rollout_early_eos.log"
echo "== one LoRA training step (configs/llada_gsm8k_lora.yaml shape, one micro-batch)"
timeout "$LIMIT" "$PY" scripts/bench_step.py "${STEP[@]}" 2>&1 | grep -v "^{" | tee "$OUT/lora_step.log"
echo "== done in $(( $(date +%s) - started )) s; outputs in $OUT/"
