#!/usr/bin/env bash
# Issue #14: the delta-rule (and KDA) and SSD decode walks with the next block of state rows loaded ahead (PREFETCH):
# the kernels alone (state in L2, and streamed from 24 pools; tools/probe_decode_prefetch.py), the 1.14B qwen3_next's
# e2e with the delta-rule launch before (16 x 1) and after (8 x 1, ahead), alternated; then the decode GPU tests.
#   run: bash tools/device_kernels.sh 560 device_delta_prefetch_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
export PYTHONPATH="tools:${PYTHONPATH:-}"
timeout 150 python3 tools/probe_decode_prefetch.py "$W/alone_delta.json" --kernel delta \
  --launches 16x1 8x1 8x1p 16x1p --rounds 3 > "$W/alone_delta.log" 2>&1
log "alone delta rc $?"
timeout 120 python3 tools/probe_decode_prefetch.py "$W/alone_ssd.json" --kernel ssd \
  --launches 16x1 16x1p 8x1p --rounds 3 > "$W/alone_ssd.log" 2>&1
log "alone ssd rc $?"
CFG=$(python3 tools/family_configs.py qwen3_next)
for run in before_1:16x1 after_1:8x1p after_2:8x1p before_2:16x1; do
  tag=${run%%:*}
  timeout 110 python3 tools/with_decode_launch.py "delta:int8_row:${run#*:}" eval speed --suite e2e \
    --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 --no-profile --model "qwen3_next:$CFG" \
    --out "$W/e2e_qwen3_next_$tag" > "$W/e2e_qwen3_next_$tag.log" 2>&1
  log "e2e qwen3_next $tag rc $?"
done
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_delta_kernels.py tests/test_decode_kernel.py \
  -k "decode or prefetch" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
