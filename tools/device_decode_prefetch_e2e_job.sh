#!/usr/bin/env bash
# Issue #14: the 1.37B GLA's e2e (`laquant eval speed --suite e2e`, graphed decode at B = 1 and 64) with the GLA int8
# decode walk's prefetch (8 x 1, ahead: the shipped tables) and without it (the 16 x 1 launch of the tables before),
# alternated, per token and with per-group output codes; then the decode kernel's GPU tests.
#   run: bash tools/device_kernels.sh 560 device_decode_prefetch_e2e_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
ARGS=(--recipe gla_int8_all --batch 1 64 --prompt 1024 --gen 32 --no-profile --model "$CFG")
E2E_TIMEOUT=90
for run in before_1:16x1 after_1:8x1p after_2:8x1p before_2:16x1; do
  launch_e2e "${run%%:*}" "gla:int8_row:${run#*:}" "${ARGS[@]}"
done
OUTPUTS=(--set projections.output_act_granularity=per_group)
launch_e2e outputs_after gla:int8_row:8x1p "${ARGS[@]}" "${OUTPUTS[@]}"
launch_e2e outputs_before gla:int8_row:16x1 "${ARGS[@]}" "${OUTPUTS[@]}"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_decode_kernel.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
