#!/usr/bin/env bash
# The hybrid capture probe alone (tools/probe_hybrid_capture.py), with the bench's qwen3_next.
#   run: bash tools/device_kernels.sh 300 device_probe_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 tools/probe_hybrid_capture.py --families qwen3_next qwen3_next_dense qwen3_next_bench \
  > "$W/probe_hybrid_capture.txt" 2>&1
log "probe rc $?"
touch "$W/job.done"
