#!/usr/bin/env bash
# The decode kernels' launch sweep by batch (tools/sweep_kernels.py state_decode: GLA, the delta rule, the SSD step;
# B = 1-64, every state format), then the GPU tests of the kernels changed since the last timed run.
set -u
. tools/device_job_env.sh "$@"
timeout 420 python3 tools/sweep_kernels.py state_decode --jobs 12 --out "$W/state_sweep.jsonl" > "$W/state_sweep.log" 2>&1
log "sweep rc $?"
timeout 300 python3 -m pytest -q -x tests/test_decode_kernel.py tests/test_delta_gating.py \
  tests/test_quantizing_rowwise.py tests/test_chunk_kernel.py > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
touch "$W/job.done"
