#!/usr/bin/env bash
# The GPU tests of the kernels whose launch wrappers now take kernels/common/sizes.py's cdiv / next_power_of_2.
#   run: bash tools/device_kernels.sh 480 device_sizes_tests_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 440 python3 -m pytest -q -rfs --tb=short -m gpu -p no:cacheprovider tests/test_decode_kernel.py \
  tests/test_delta_gating.py tests/test_delta_kernels.py tests/test_kda_kernels.py tests/test_short_conv.py \
  tests/test_int8_gemm_kernel.py tests/test_gemm_decode.py tests/test_store_kernel.py tests/test_ngram_draft.py \
  > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
touch "$W/job.done"
