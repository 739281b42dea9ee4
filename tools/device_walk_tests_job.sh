#!/usr/bin/env bash
# GPU tests of the delta-rule / KDA prefill walk with its default launch (two pipeline stages at 16-token chunks).
#   run: bash tools/device_kernels.sh 200 device_walk_tests_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_delta_kernels.py tests/test_kda_kernels.py \
  -k "prefill_matches or model_sized_heads or varlen or pieces or recurrence" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
