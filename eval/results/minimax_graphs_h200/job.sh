#!/usr/bin/env bash
# MiniMax's decode steps graphed (its static cache a MiniMaxCache too): the GPU tests of the graphed loops on
# minimax (fp32: captured or the eager fallback, greedy tokens equal the eager loop's; bf16: captured), then the
# e2e decode of a 1.43B MiniMax-style model (tools/family_configs.py), bf16 and hybrid_int8, eager and graphed.
#   run (from tools/ as device_minimax_graphs_job.sh): bash tools/device_kernels.sh 420 device_minimax_graphs_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_static_hybrid.py -k "minimax" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
E2E_TIMEOUT=230 hybrid_e2e minimax ""
touch "$W/job.done"
