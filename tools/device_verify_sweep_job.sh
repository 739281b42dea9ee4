#!/usr/bin/env bash
# Issue #19: the verify kernels' launch sweep (blocks, warps, next-token prefetch) at the e2e models' shapes,
# written into the device copy's tables, then the verify bench against a decode step (B = 64, 4 and 8 tokens)
# and the GPU tests of the verify kernels and speculative decoding on the new tables.
#   run: bash tools/device_kernels.sh 560 device_verify_sweep_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 420 python3 tools/sweep_kernels.py verify --jobs 14 --write --out "$W/verify_sweep.jsonl" \
  > "$W/verify_sweep.log" 2>&1
log "sweep rc $?"
git diff kernels/common/state_io.py > "$W/tables.diff"
timeout 240 python3 tools/bench_verify.py --no-speculative --batch 64 --tokens 4 8 \
  --formats int8_row:stochastic bf16 fp32 --out "$W/verify_bench" > "$W/verify_bench.log" 2>&1
log "bench rc $?"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_verify.py > "$W/gpu_tests_verify.log" 2>&1
log "verify tests rc $?"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_speculative.py tests/test_ngram_draft.py \
  > "$W/gpu_tests_speculative.log" 2>&1
log "tests rc $?"
touch "$W/job.done"
