#!/usr/bin/env bash
# Issue #19 / #14: the GLA decode kernel's sweep with smaller K blocks and the verify kernels' commit sweep, both
# written into the device copy's tables (the verify step's tables are already in the tree); the verify bench
# (B = 64, 4 and 8 tokens) and the GPU tests on the new tables; then issue #14's GLA e2e with the new decode tables
# against the checkout before them (scratch/base_pkg, carried, first on PYTHONPATH: *_base).
#   run: bash tools/device_kernels.sh 560 device_verify_commit_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 tools/sweep_kernels.py state_decode --kernels gla --blocks 4 8 16 --write \
  > "$W/decode_sweep.log" 2>&1
log "decode sweep rc $?"
timeout 420 python3 tools/sweep_kernels.py verify --steps commit --jobs 14 --write --out "$W/commit_sweep.jsonl" \
  > "$W/commit_sweep.log" 2>&1
log "commit sweep rc $?"
git diff kernels/common/state_io.py > "$W/tables.diff"
timeout 240 python3 tools/bench_verify.py --no-speculative --batch 64 --tokens 4 8 \
  --formats int8_row:stochastic bf16 fp32 --out "$W/verify_bench" > "$W/verify_bench.log" 2>&1
log "bench rc $?"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_verify.py tests/test_decode_kernel.py \
  > "$W/gpu_tests_kernels.log" 2>&1
log "kernel tests rc $?"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_speculative.py \
  tests/test_graphed_step.py > "$W/gpu_tests_speculative.log" 2>&1
log "speculative tests rc $?"
bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$PWD/scratch/base_pkg:$PYTHONPATH" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
