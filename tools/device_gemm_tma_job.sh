#!/usr/bin/env bash
# Issue #14 (prepared 2026-11-30, not yet run): the TMA split-K GEMM experiment (tools/exp_gemm_tma.py) on the GPU:
# its outputs checked against float64 on odd shapes, then timed against the shipped split-K kernel and cuBLAS bf16
# at the 1.37B GLA layer's four GEMMs, M = 1, 16, 64 (weights streamed from device memory).
#   run: bash tools/device_kernels.sh 540 device_gemm_tma_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 480 python3 tools/exp_gemm_tma.py --check --out "$W/gemm_tma.json" > "$W/gemm_tma.log" 2>&1
log "gemm tma rc $?"
touch "$W/job.done"
