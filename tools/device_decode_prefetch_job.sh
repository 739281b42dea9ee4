#!/usr/bin/env bash
# Issue #14: the decode kernels with each K block's loads issued before the previous block's arithmetic (prefetch):
# the decode sweep (fp32 and int8_row:stochastic, the e2e models' states; K blocks 16, 64, 128; 1-4 warps; prefetch
# on and off) written into the device copy's tables, the decode kernels' prefetch tests on the GPU, the qwen3_next
# hybrid's e2e on the new tables and on the checkout before (scratch/base_pkg, carried: *_base), then GLA's e2e.
#   run: bash tools/device_kernels.sh 320 device_decode_prefetch_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
timeout 150 python3 tools/sweep_kernels.py state_decode --formats fp32 int8_row:stochastic --blocks 16 64 128 \
  --warps 1 2 4 --write > "$W/decode_sweep.log" 2>&1
log "decode sweep rc $?"
git diff kernels/common/state_io.py > "$W/tables.diff"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_decode_kernel.py tests/test_delta_kernels.py \
  -k "prefetch or decode_kernel_matches or decode_matches" > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
bash tools/device_hybrid_e2e.sh "$W"
PYTHONPATH="$PWD/scratch/base_pkg:$PYTHONPATH" E2E_TAG=_base bash tools/device_hybrid_e2e.sh "$W"
bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
