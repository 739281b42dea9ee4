#!/usr/bin/env bash
# Issue #14: per-token codes from the norms, per-group codes from the decode kernel and SwiGLU
# (tools/probe_mixed_granularity.py), against bf16, per token and per group, graphed B = 64 and 1.
#   run: bash tools/device_kernels.sh 560 device_mixed_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
PYTHONPATH="tools:${PYTHONPATH:-}" timeout 400 python3 tools/probe_mixed_granularity.py "$W/mixed.json" \
  > "$W/mixed.log" 2>&1
log "mixed rc $?"
touch "$W/job.done"
