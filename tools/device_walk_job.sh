#!/usr/bin/env bash
# The prefill walk's launch parameters for one long sequence (tools/sweep_walk.py), the delta rule and KDA.
#   run: bash tools/device_kernels.sh 300 device_walk_job.sh
set -u
. tools/device_job_env.sh "$@"
export PYTHONPATH=$PYTHONPATH:$PWD/tools
timeout 280 python3 tools/sweep_walk.py --shape 1x16384 > "$W/sweep_walk.jsonl" 2> "$W/sweep_walk.err"
log "sweep rc $?"
touch "$W/job.done"
