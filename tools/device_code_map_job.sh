#!/usr/bin/env bash
# Issue #14, second run of the side-stream work: the gate branch (laquant/models/side_stream.py) with the producers
# loading the packed column map of a GEMM with outlier columns at their start (triton_numerics.token_code_map; the
# gathered codes of run 1 reverted). Steps: the GPU tests of the codes producers, the int8 GEMM and the branch; the
# producers timed alone, this tree and the checkout before the session (scratch/base_pkg, *_base); the 1.37B GLA e2e
# (new, base, branch off) and the 1.14B qwen3_next e2e (new, base).
#   run: bash tools/device_kernels.sh 560 device_code_map_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
timeout 420 python3 -m pytest -q -rfs --tb=short tests/test_side_stream.py tests/test_fused_layer_ops.py \
  tests/test_int8_gemm_kernel.py tests/test_gpu_model.py > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
bash tools/device_codes_bench.sh "$W"
bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
LAQUANT_SIDE_STREAM=0 E2E_TAG=_no_branch bash tools/device_gla_e2e.sh "$W"
bash tools/device_hybrid_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
