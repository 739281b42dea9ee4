#!/usr/bin/env bash
# Train the qwen3_next-style hybrid reference model, run its recipe ablation on the GPU, then the
# GPU tests and GEMM suite of device_verify_job.sh (run by device_kernels.sh WAIT device_hybrid_train_job.sh;
# carry .devdata/train .devdata/calibration). A failed step ends the job (job.failed).
W=$1
set -x
python3 -m laquant.eval.train model --arch qwen3_next --size small --lr 3e-3 --batch 16 --time-budget 420 \
  --data-dir .devdata --tokenizer laquant/assets/gla-small --out "$W/qwen3next-small" > "$W/train_hybrid.log" 2>&1 \
  || { touch "$W/job.failed" "$W/job.done"; exit 1; }
python3 -m laquant.eval.ablation "$W/qwen3next-small" --device cuda --max-tokens 32768 --samples 64 --quiet \
  --out "$W/ablation_qwen3next-small_h100" > "$W/ablation.log" 2>&1 || touch "$W/job.failed"
bash eval/scripts/device_verify_job.sh "$W"
