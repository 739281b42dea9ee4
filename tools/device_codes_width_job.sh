#!/usr/bin/env bash
# Issue #14: the producers (norms, SwiGLU) write W8A8 codes for GEMMs up to 16,384 inputs (a 7B model's 11,008-wide
# down_proj: one program of 16 warps holds the row), and quantize_rows takes such rows in one tile. Steps: the kernel
# tests of the codes paths; the GPU test of a wider MLP (which still quantizes apart); the 6.9B GLA 4096x32 e2e
# (was 1.46x with a separate quantization pass before down_proj) and the 1.37B GLA e2e. Results under $1.
#   run: bash tools/device_kernels.sh 560 device_codes_width_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 400 python3 -m pytest -q -rfs --tb=short tests/test_fused_layer_ops.py tests/test_int8_gemm_kernel.py \
  tests/test_quantizing_rowwise.py > "$W/gpu_tests_kernels.log" 2>&1
log "kernel tests rc $?"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_gpu_model.py > "$W/gpu_tests_model.log" 2>&1
log "gpu model tests rc $?"
bash tools/device_gla_e2e.sh "$W" 7b
bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
