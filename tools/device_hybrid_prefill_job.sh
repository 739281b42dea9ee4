#!/usr/bin/env bash
# Issue #14, the hybrid's prefill (hybrid_int8 prefilled at 0.58x bf16's tokens/s in state_bits_h200/run4): the
# rowwise codes path's GPU test, then tools/profile_hybrid_decode.py on the 1.14B qwen3_next at B = 64, prompt 1,024,
# whose rows now hold one B = 1 prefill's wall time, kernels and host profile.
# Run by `bash tools/device_kernels.sh WAIT device_hybrid_prefill_job.sh`. $1: work folder.
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_quantizing_rowwise.py > "$W/gpu_tests_rowwise.log" 2>&1
log "rowwise gpu tests rc $?"
BATCH=64 PROMPT=1024 timeout 400 python3 tools/profile_hybrid_decode.py "$W/profile_hybrid_b64.json" \
  eval/results/graphed_hybrid_h200/qwen3_next_2048x16_config.json > "$W/profile_hybrid.log" 2>&1
log "profile rc $?"
touch "$W/job.done"
