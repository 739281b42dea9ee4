#!/usr/bin/env bash
# Issue #14: the B = 64 graphed decode step as micro-batches whose graphs replay side by side
# (tools/bench_microbatch.py): the 1.37B GLA (bf16, gla_int8_all) in 2 and 4 parts, the 1.14B qwen3_next (bf16,
# hybrid_int8) in 2.
#   run: bash tools/device_kernels.sh 560 device_microbatch_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 400 python3 tools/bench_microbatch.py "$W/microbatch_gla.json" gla 2 4 > "$W/microbatch_gla.log" 2>&1
log "gla rc $?"
timeout 300 python3 tools/bench_microbatch.py "$W/microbatch_hybrid.json" qwen3_next 2 > "$W/microbatch_hybrid.log" 2>&1
log "hybrid rc $?"
touch "$W/job.done"
