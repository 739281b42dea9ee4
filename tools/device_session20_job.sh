#!/usr/bin/env bash
# Session of 2026-12-06 (twentieth), ~10 minutes of device time (ran: eval/results/session20_h100/gla_minimax/):
# 1. issue #14's GLA benchmark on this tree (tools/device_gla_e2e.sh 1b: bf16 vs gla_int8_all, graphed, B = 1 and 64,
#    prompt 4,096, with the eager step's kernel profile), last run on an H200 (decode_prefetch_h200/);
# 2. tools/device_minimax_prefill_job.sh (MiniMax's graphed prefill GPU test, its e2e, the short conv bench).
#   bash tools/device_kernels.sh 560 device_session20_job.sh   (poll with the same line until JOB DONE)
set -u
W=${1:-$OUT}
bash tools/device_gla_e2e.sh "$W" 1b
bash tools/device_minimax_prefill_job.sh "$W"
