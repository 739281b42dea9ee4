#!/usr/bin/env bash
# The delta-rule session's GPU work (device_kernels.sh WAIT device_delta_job.sh; carry the fla wheels,
# .devdata/train and .devdata/calibration):
# 1. GPU tests of the delta-rule kernels and of the hybrids on the kernels;
# 2. the delta_decode / delta_prefill speed suites against fla;
# 3. the qwen3_next-style hybrid reference model trained again (seeded) and its recipe ablation,
#    now with the Gated DeltaNet layers on the delta-rule kernels.
W=$1
set -x
python3 -m pytest -q tests/test_delta_kernels.py > "$W/kernel_tests.log" 2>&1
python3 -m pytest -q -m gpu tests/test_hybrid.py > "$W/gpu_tests.log" 2>&1
python3 -m laquant.cli eval speed --suite delta_decode delta_prefill --out "$W/speed_delta" > "$W/speed_delta.log" 2>&1
python3 -m laquant.eval.train model --arch qwen3_next --size small --lr 3e-3 --batch 16 --time-budget 420 \
  --data-dir .devdata --tokenizer laquant/assets/gla-small --out "$W/qwen3next-small" > "$W/train_hybrid.log" 2>&1 \
  || { touch "$W/job.failed" "$W/job.done"; exit 1; }
rm -f "$W"/qwen3next-small/*.safetensors.partial-*
python3 -m laquant.eval.ablation "$W/qwen3next-small" --device cuda --max-tokens 32768 --samples 64 --quiet \
  --out "$W/ablation_qwen3next-small_h100_kernels" > "$W/ablation.log" 2>&1 || touch "$W/job.failed"
rm -f "$W"/qwen3next-small/model.safetensors  # 20 MB: the numbers come back, not the weights
touch "$W/job.done"
