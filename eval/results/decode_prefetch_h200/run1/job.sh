#!/usr/bin/env bash
# Issue #14: the GLA int8 decode kernel's walk with the next block of state rows loaded ahead (PREFETCH), alone (state
# hot in L2, and streamed from 24 pools) and in the graphed B = 64 step of the random 1.37B GLA, per token and with
# per-group output codes (tools/probe_decode_prefetch.py).
#   run: bash tools/device_kernels.sh 560 device_decode_prefetch_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
for v in gla_int8_all gla_int8_all+projections.output_act_granularity=per_group; do
  tag=${v//[^a-z0-9_]/_}
  PYTHONPATH="tools:${PYTHONPATH:-}" timeout 250 python3 tools/probe_decode_prefetch.py "$W/prefetch_$tag.json" \
    --variant "$v" --launches 16x1 8x1 8x1p 16x1p 8x2p --rounds 3 > "$W/prefetch_$tag.log" 2>&1
  log "prefetch $v rc $?"
done
touch "$W/job.done"
