#!/usr/bin/env bash
# The SSD decode step's launch sweep (tools/sweep_ssd_decode.py): Mamba2 heads, B = 1 and 64, fp32 and int8 states.
set -u
. tools/device_job_env.sh "$@"
timeout 400 python3 tools/sweep_ssd_decode.py "$W/ssd_sweep.jsonl" > "$W/ssd_sweep.log" 2>&1
log "sweep rc $?"
touch "$W/job.done"
