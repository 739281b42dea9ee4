#!/usr/bin/env bash
# What the GPU check of 2026-12-06 (eval/results/gpu_check_h100/) left open, ~5 minutes of device time:
# 1. the hybrids' graphed prefill GPU test with MiniMax among its cases (refused until that run explained its failure,
#    whose rest never ran) and the quantized checks' tolerance of 1e-3;
# 2. the MiniMax-style 1.43B's e2e, its prefill replayed;
# 3. the prompt short conv over qwen3_next's own columns, against the PyTorch path (the bench stopped at its own
#    layout check there).
#   bash tools/device_kernels.sh 400 device_minimax_prefill_job.sh   (ran on 2026-12-06 inside device_session20_job.sh:
#   eval/results/session20_h100/gla_minimax/)
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -v -rfs --tb=long -m gpu tests/test_graphed_hybrid_prefill.py \
  > "$W/gpu_tests_prefill.log" 2>&1
log "graphed prefill gpu tests rc $?"
E2E_TIMEOUT=200 hybrid_e2e minimax ""
timeout 120 python3 tools/bench_short_conv.py --out "$W/short_conv" > "$W/short_conv.log" 2>&1
log "short conv bench rc $?"
touch "$W/job.done"
