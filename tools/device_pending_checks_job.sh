#!/usr/bin/env bash
# What the 2026-11-30 (second) session left for the GPU, in one job: the verify kernels' full GPU tests (the delta
# rule's decode-numerics verify now shares its token step with the one-chunk kernel's fallback; the one-chunk verify
# with bf16 inputs), then the TMA split-K GEMM experiment (tools/exp_gemm_tma.py, issue #14).
#   run: bash tools/device_kernels.sh 560 device_pending_checks_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_verify.py > "$W/gpu_tests_verify.log" 2>&1
log "verify gpu tests rc $?"
timeout 300 python3 tools/exp_gemm_tma.py --check --out "$W/gemm_tma.json" > "$W/gemm_tma.log" 2>&1
log "gemm tma rc $?"
touch "$W/job.done"
