#!/usr/bin/env bash
# Issue #14: the Mamba2 (SSD) decode walk with the next block of state rows loaded ahead, end to end: the ~1.15B
# Nemotron-H's e2e with the SSD int8 launch at B = 64 without (16 x 1) and with the prefetch (16 x 1, ahead), alternated.
#   run: bash tools/device_kernels.sh 420 device_ssd_prefetch_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
CFG=$(python3 tools/family_configs.py nemotron_h)
E2E_TIMEOUT=100
for run in before_1:16x1 after_1:16x1p after_2:16x1p before_2:16x1; do
  launch_e2e "nemotron_h_${run%%:*}" "ssd:int8_row:${run#*:}" --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 \
    --gen 32 --no-profile --model "nemotron_h:$CFG"
done
touch "$W/job.done"
