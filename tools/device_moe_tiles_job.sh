#!/usr/bin/env bash
# The int8 experts' one-launch alignment and tile rule (2026-12-05, eval/results/moe_experts_h200/ run 2): their GPU
# tests, the MoE e2e on the 2.25B Qwen3-Next-style model and MiniMax, then the kernel bench with the tile sweep.
# E2E_ONLY=1: the two e2e runs alone (run 3, the rule fitted to run 2's sweep). Results under $1.
#   run: bash tools/device_kernels.sh 540 device_moe_tiles_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
if [ -z "${E2E_ONLY:-}" ]; then
  timeout 200 python3 -m pytest -v -rfs --tb=short tests/test_moe_experts.py > "$W/gpu_tests_moe.log" 2>&1
  log "moe tests rc $?"
fi
E2E_TIMEOUT=220 hybrid_e2e qwen3_next _moe "$(python3 tools/family_configs.py qwen3_next --moe)"
E2E_TIMEOUT=160 hybrid_e2e minimax ""
if [ -z "${E2E_ONLY:-}" ]; then
  timeout 420 python3 tools/bench_moe_experts.py "$W/moe_experts.json" --sweep > "$W/moe_experts.log" 2>&1
  log "bench rc $?"
fi
touch "$W/job.done"
