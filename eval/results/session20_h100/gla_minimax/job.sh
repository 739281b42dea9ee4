#!/usr/bin/env bash
# Session of 2026-12-06 (twentieth), ~10 minutes of device time:
# 1. what tools/device_minimax_prefill_job.sh runs (MiniMax's graphed prefill GPU test, its e2e, the short conv bench);
# 2. issue #14's GLA benchmark on this tree (tools/device_gla_e2e.sh 1b: bf16 vs gla_int8_all, graphed, B = 1 and 64,
#    prompt 4,096, with the eager step's kernel profile), last run on an H200 (decode_prefetch_h200/).
#   bash tools/device_kernels.sh 560 device_session20_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
bash tools/device_gla_e2e.sh "$W" 1b
timeout 240 python3 -m pytest -v -rfs --tb=long -m gpu tests/test_graphed_hybrid_prefill.py \
  > "$W/gpu_tests_prefill.log" 2>&1
log "graphed prefill gpu tests rc $?"
E2E_TIMEOUT=200 hybrid_e2e minimax ""
timeout 120 python3 tools/bench_short_conv.py --out "$W/short_conv" > "$W/short_conv.log" 2>&1
log "short conv bench rc $?"
touch "$W/job.done"
