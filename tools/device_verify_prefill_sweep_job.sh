#!/usr/bin/env bash
# Issue #19: the launch table of the verify step with numerics "prefill" (tools/sweep_kernels.py verify --steps
# verify_prefill, B = 64, the 8- and 16-bit formats, both kernels), written into this copy's
# kernels/common/state_io.py (brought back as state_io.py), then the verify bench at B = 64 on it, and the
# speculative tests on the GPU.
#   run: bash tools/device_kernels.sh 560 device_verify_prefill_sweep_job.sh   (carry .whl)
set -u
. tools/device_job_env.sh "$@"
timeout 330 python3 tools/sweep_kernels.py verify --steps verify_prefill --batches 64 --jobs 16 \
  --formats int8_row:stochastic fp8_row:stochastic bf16 --out "$W/sweep_prefill.jsonl" > "$W/sweep_prefill.log" 2>&1
log "sweep rc $?"
python3 tools/sweep_kernels.py verify --write --from "$W/sweep_prefill.jsonl" >> "$W/sweep_prefill.log" 2>&1
log "write rc $?"
cp kernels/common/state_io.py "$W/state_io.py"
timeout 150 python3 tools/bench_verify.py --no-speculative --batch 64 --tokens 4 8 \
  --formats int8_row:stochastic fp8_row:stochastic bf16 --out "$W/verify_bench" > "$W/verify_bench.log" 2>&1
log "verify bench rc $?"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_speculative.py -k "gpu or numerics" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
