#!/usr/bin/env bash
# Issue #14: what the outlier columns cost the int8 GEMMs, padded to a multiple of 16 (PackedOutlierWeight.pack) or
# not (tools/probe_gemm_outliers.py); the GEMM, fused-op and rowwise tests on the GPU; then the 1.14B qwen3_next's
# e2e (bf16 vs hybrid_int8, prompt 1,024, B = 1 and 64) with its B = 64 step's and prefill's profile, and the
# 1.37B GLA's (bf16 vs gla_int8_all, prompt 4,096).
# Run by `bash tools/device_kernels.sh WAIT device_gemm_outliers_job.sh`. $1: work folder.
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 tools/probe_gemm_outliers.py "$W/probe_gemm_outliers.json" > "$W/probe_gemm_outliers.log" 2>&1
log "probe rc $?"
timeout 400 python3 -m pytest -q -rfs --tb=short tests/test_int8_gemm_kernel.py tests/test_gemm_decode.py \
  tests/test_fused_layer_ops.py > "$W/gpu_tests_gemm.log" 2>&1
log "gemm tests rc $?"
timeout 200 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_quantizing_rowwise.py > "$W/gpu_tests_rowwise.log" 2>&1
log "rowwise gpu tests rc $?"
bash tools/device_hybrid_e2e.sh "$W"
bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
