#!/usr/bin/env bash
# Train the qwen3_next-style hybrid reference model and run its recipe ablation on the GPU (the
# Gated DeltaNet layers on the delta-rule kernels) (run by device_kernels.sh WAIT device_hybrid_train_job.sh;
# carry .devdata/train .devdata/calibration). A failed step ends the job (job.failed). The weights
# (20 MB) are deleted at the end: the numbers come back, the seeded run can be repeated.
W=$1
set -x
python3 tools/train.py model --arch qwen3_next --size small --lr 3e-3 --batch 16 --time-budget 420 \
  --data-dir .devdata --tokenizer laquant/assets/gla-small --out "$W/qwen3next-small" > "$W/train_hybrid.log" 2>&1 \
  || { touch "$W/job.failed" "$W/job.done"; exit 1; }
python3 tools/ablation.py "$W/qwen3next-small" --device cuda --max-tokens 32768 --samples 64 --quiet \
  --out "$W/ablation_qwen3next-small_h100" > "$W/ablation.log" 2>&1 || touch "$W/job.failed"
rm -f "$W"/qwen3next-small/model.safetensors
touch "$W/job.done"
