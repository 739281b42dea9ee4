#!/usr/bin/env bash
# Issue #14 on an H100: the GLA int8 decode launch at B = 64 end to end. The launch sweep alone on the H100
# (eval/results/session21_h100/decode_sweep/) put 16 x 1 (loading ahead) at 10.86 us against the table's 8 x 1
# (ahead, chosen inside the H200's graphed step) at 11.84. The 1.37B GLA's e2e (graphed, B = 64, prompt 1,024) with
# 8x1p (the table), 16x1p and 16x1, alternated, twice each.
#   run: bash tools/device_kernels.sh 560 device_h100_decode_launch_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
ARGS=(--recipe gla_int8_all --batch 64 --prompt 1024 --gen 32 --no-profile --model "$CFG")
E2E_TIMEOUT=90
for run in table_1:8x1p ahead16_1:16x1p plain16_1:16x1 table_2:8x1p ahead16_2:16x1p plain16_2:16x1; do
  launch_e2e "${run%%:*}" "gla:int8_row:${run#*:}" "${ARGS[@]}"
done
touch "$W/job.done"
