#!/usr/bin/env bash
# Issue #14: Qwen3-Next's gated softmax attention on the static decode step (laquant.models.gated_attention:
# q/k norm + rotary + cache write in one kernel, the sigmoid-gated output writing o_proj's codes). Steps: the GPU
# tests of the new kernels and of the hybrid paths they run in; the hybrid e2e and its B = 64 profile.
# Results under $1, one status line a step.   run: bash tools/device_kernels.sh 560 device_gated_attention_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_gated_attention.py tests/test_fused_layer_ops.py \
  > "$W/gpu_tests_kernels.log" 2>&1
log "kernel tests rc $?"
timeout 400 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_quantizing_rowwise.py tests/test_static_hybrid.py \
  tests/test_gated_attention.py > "$W/gpu_tests_hybrid.log" 2>&1
log "hybrid gpu tests rc $?"
bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
