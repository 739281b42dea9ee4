#!/usr/bin/env bash
# The shortest GPU check of the code built without a GPU (sessions of 2026-12-05/06), for a session left with a few
# minutes of device time: the GPU tests of the fused last norm, rotary cos / sin and MoE shared sum, and a static
# (graphed) hybrid on them; then the dense qwen3_next's e2e, this tree and the checkout before (scratch/base_pkg).
#   bash tools/device_kernels.sh 300 device_first_gpu_check_job.sh      (carry scratch/base_pkg for the e2e pair)
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -v -rfs --tb=short -m gpu tests/test_quantizing_rowwise.py tests/test_fused_rotary.py \
  tests/test_fused_moe.py tests/test_static_hybrid.py > "$W/gpu_tests_first.log" 2>&1
log "first gpu tests rc $?"
E2E_TIMEOUT=200 hybrid_e2e qwen3_next ""
E2E_TIMEOUT=200 hybrid_e2e qwen3_next _base
touch "$W/job.done"
