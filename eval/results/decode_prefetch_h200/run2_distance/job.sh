#!/usr/bin/env bash
# Issue #14: the GLA int8 decode kernel's walk with the next block(s) of state rows loaded ahead (PREFETCH), alone
# (state hot in L2, and streamed from 24 pools) and in the graphed B = 64 step of the random 1.37B GLA
# (tools/probe_decode_prefetch.py); then the decode kernel's GPU tests.
#   run: bash tools/device_kernels.sh 560 device_decode_prefetch_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
for v in ${VARIANTS:-gla_int8_all}; do
  tag=${v//[^a-z0-9_]/_}
  PYTHONPATH="tools:${PYTHONPATH:-}" timeout 250 python3 tools/probe_decode_prefetch.py "$W/prefetch_$tag.json" \
    --variant "$v" --launches ${LAUNCHES:-16x1 8x1p 8x1pp 16x1p} --rounds 3 > "$W/prefetch_$tag.log" 2>&1
  log "prefetch $v rc $?"
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_decode_kernel.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
# run with LAUNCHES default '16x1 8x1p 8x1pp 16x1p' ('pp': two blocks ahead, the kernel's PREFETCH == 2 of that commit's working tree, since removed)
