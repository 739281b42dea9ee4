#!/usr/bin/env bash
# Issue #14: the Mamba2 (SSD) decode walk with the next block of state rows loaded ahead, end to end: the ~1.15B
# Nemotron-H's e2e with the SSD int8 launch at B = 64 without (16 x 1) and with the prefetch (16 x 1, ahead), alternated.
#   run: bash tools/device_kernels.sh 420 device_ssd_prefetch_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
export PYTHONPATH="tools:${PYTHONPATH:-}"
CFG=$(python3 tools/family_configs.py nemotron_h)
for run in before_1:16x1 after_1:16x1p after_2:16x1p before_2:16x1; do
  tag=${run%%:*}
  timeout 100 python3 tools/with_decode_launch.py "ssd:int8_row:${run#*:}" eval speed --suite e2e \
    --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 --no-profile --model "nemotron_h:$CFG" \
    --out "$W/e2e_nemotron_h_$tag" > "$W/e2e_nemotron_h_$tag.log" 2>&1
  log "e2e nemotron_h $tag rc $?"
done
touch "$W/job.done"
