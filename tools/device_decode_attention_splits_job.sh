#!/usr/bin/env bash
# The decode attention kernel's split count (spans of positions a sequence's key head is cut into) swept at the bench
# shapes, to set its default rule.   run: bash tools/device_kernels.sh 200 device_decode_attention_splits_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 150 python3 tools/bench_decode_attention.py "$W/bench_splits.json" --splits 1 2 3 4 8 16 > "$W/bench_splits.log" 2>&1
log "bench rc $?"
touch "$W/job.done"
