#!/usr/bin/env bash
# After the review of 2026-12-02: the codes producers (store_token_codes' cache modifier, codes_consts) on the GPU.
#   run: bash tools/device_kernels.sh 170 device_review_checks_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 60 python3 -m pytest -q -x -rfs --tb=short tests/test_decode_kernel.py -k "output_norm" \
  > "$W/gpu_tests_decode.log" 2>&1
log "decode tests rc $?"
timeout 90 python3 -m pytest -q -x -rfs --tb=short tests/test_fused_layer_ops.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
