#!/usr/bin/env bash
# Issue #14, second run: the norms alone scatter the codes of a GEMM with outlier columns from their registers (SwiGLU
# reads them back again: scattered it was slower). Steps: the producers' GPU tests; the producers timed alone and the
# 1.37B GLA / 1.14B qwen3_next e2e, this tree and the checkout before (scratch/base_pkg, first on PYTHONPATH: *_base).
#   run: bash tools/device_kernels.sh 560 device_scatter_norms_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 200 python3 -m pytest -q -rfs --tb=short tests/test_fused_layer_ops.py > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
bash tools/device_codes_bench.sh "$W"
bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
E2E_PROFILE=0 bash tools/device_hybrid_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base E2E_PROFILE=0 bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
