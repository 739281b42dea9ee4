#!/usr/bin/env bash
# Issue #14: the split-K GEMM asks for its weight slice in L2 (bulk prefetch, one thread) before its PDL wait, so the
# weight stream overlaps the kernel before it. GPU tests with PDL on every launch; the 1.37B GLA e2e with the prefetch
# (default) and without (LAQUANT_GEMM_PREFETCH=0: *_noprefetch), twice each, interleaved; the 1.14B qwen3_next e2e both ways.
#   run: bash tools/device_kernels.sh 560 device_prefetch_job.sh
set -u
. tools/device_job_env.sh "$@"
LAQUANT_PDL=all timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_int8_gemm_kernel.py \
  tests/test_graphed_step.py > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
for run in 1 2; do
  E2E_TAG=_run$run bash tools/device_gla_e2e.sh "$W"
  LAQUANT_GEMM_PREFETCH=0 E2E_TAG=_noprefetch_run$run bash tools/device_gla_e2e.sh "$W"
done
bash tools/device_hybrid_e2e.sh "$W"
LAQUANT_GEMM_PREFETCH=0 E2E_TAG=_noprefetch bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
