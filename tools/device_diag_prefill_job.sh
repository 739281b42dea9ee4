#!/usr/bin/env bash
# tools/diag_prefill_timing.py on the GPU: the eager 4K prefill timed three ways, piece bounds kept or not.
#   run: bash tools/device_kernels.sh 400 device_diag_prefill_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 500 python3 tools/diag_prefill_timing.py "$W/prefill_timing.json" > "$W/prefill_timing.log" 2>&1
log "diag rc $?"
touch "$W/job.done"
