#!/usr/bin/env bash
# Issue #14 (2026-12-04): the int8 state's stochastic rounding in fewer instructions (the floor rule on y + 128, no
# sign test; Philox at 7 rounds), against the checkout before (scratch/base_pkg, d332d12: *_base): the shipped GLA decode
# kernel at B = 64 (tools/exp_state_step.py --shipped), the GPU tests of every kernel that rounds a state
# stochastically, the GLA 1.37B e2e (B = 1 and 64) and the qwen3_next 1.14B hybrid e2e, both ways.
#   run: bash tools/device_kernels.sh 560 device_sr_offset_job.sh   (carry scratch/base_pkg)
set -u
. tools/device_job_env.sh "$@"
have_base || { touch "$W/job.done"; exit 1; }
timeout 150 python3 tools/exp_state_step.py "$W/state_step.json" --shipped > "$W/state_step.log" 2>&1
log "state step rc $?"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 150 python3 tools/exp_state_step.py "$W/state_step_base.json" --shipped \
  > "$W/state_step_base.log" 2>&1
log "state step base rc $?"
E2E_BATCHES="1 64" bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_BATCHES="1 64" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
hybrid_e2e qwen3_next ""
hybrid_e2e qwen3_next _base
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_stochastic_rounding.py tests/test_decode_kernel.py \
  tests/test_store_kernel.py tests/test_delta_kernels.py tests/test_kda_kernels.py tests/test_chunk_kernel.py \
  tests/test_verify.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
