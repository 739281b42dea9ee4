#!/usr/bin/env bash
# Issue #14: Qwen3-Next's gated softmax attention on the static decode step (laquant.models.gated_attention:
# q/k norm + rotary + cache write in one kernel, the sigmoid-gated output writing o_proj's codes), and the kernels'
# bf16 roundings made with a PTX conversion (kernels.common.triton_numerics.rounded). Steps: the kernel tests whose
# kernels round (on the GPU, bf16); every gpu-marked test; the hybrid e2e and its B = 64 profile; the GLA e2e.
# Results under $1, one status line a step.   run: bash tools/device_kernels.sh 560 device_gated_attention_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 400 python3 -m pytest -q -rfs --tb=short tests/test_gated_attention.py tests/test_fused_layer_ops.py \
  tests/test_short_conv.py tests/test_delta_gating.py > "$W/gpu_tests_kernels.log" 2>&1
log "kernel tests rc $?"
timeout 900 python3 -m pytest -q -rfs --tb=short -m gpu -p no:cacheprovider --durations=10 tests \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
bash tools/device_hybrid_e2e.sh "$W"
bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
