#!/usr/bin/env bash
# Issue #14: the graphed fresh prefill (laquant.generate.prefill(graphed=True)) on the GPU: its tests and the resumed
# prefill's, generate's graphed tests, then the 1.37B GLA's e2e (bf16 and gla_int8_all, prompt 4,096, B = 1 and 64)
# with the new prefill_graphed_tok_per_s row beside the eager prefill's wall clock and GPU time.
#   run: bash tools/device_kernels.sh 560 device_graphed_prefill_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -q -rfs --tb=short tests/test_graphed_prefill.py tests/test_generate.py -m gpu \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
E2E_BATCHES="1 64" bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
