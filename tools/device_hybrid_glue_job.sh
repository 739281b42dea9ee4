#!/usr/bin/env bash
# Issue #14, the hybrid's decode glue (after tools/device_gemm_h200_job.sh): qwen3_next's v and z no longer copied
# out of in_proj_qkvz (the short conv kernel reads q, k, v and the gated norm z in place), on the committed H200
# GEMM table. Steps: the GPU tests of the kernels and paths that changed (short conv, the gated norm with a grouped
# gate, the GEMM table, the hybrids' codes path and graph capture); the hybrid e2e and its B = 64 profile; then
# issue #19's verify kernels against the decode step at B = 64 (tools/bench_verify.py, kernels only).
# Results under $1, one status line a step.   run: bash tools/device_kernels.sh 560 device_hybrid_glue_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 400 python3 -m pytest -q -rfs --tb=short tests/test_short_conv.py tests/test_fused_layer_ops.py \
  tests/test_gemm_decode.py > "$W/gpu_tests_kernels.log" 2>&1
log "kernel tests rc $?"
timeout 400 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_quantizing_rowwise.py tests/test_static_hybrid.py \
  > "$W/gpu_tests_hybrid.log" 2>&1
log "hybrid gpu tests rc $?"
bash tools/device_hybrid_e2e.sh "$W"
timeout 300 python3 tools/bench_verify.py --out "$W/verify" --no-speculative --batch 64 --tokens 4 8 \
  --formats int8_row:stochastic bf16 fp32 > "$W/verify.log" 2>&1
log "verify bench rc $?"
touch "$W/job.done"
