#!/usr/bin/env bash
# Issue #14: the decode kernels' walk over the K rows pipelined (STAGES, tl.range's num_stages): GPU tests of the
# tabled launches and a pipelined walk; the decode launch sweep at B = 16 and 64 with stages (the tables' B = 1 / 4
# buckets kept), written into this copy's table (brought back as state_io.py); then the e2e decode (graphed, B = 1
# and 64) of the 1.37B GLA (gla_int8_all) and the 1.14B qwen3_next (hybrid_int8), this tree and the checkout before
# (scratch/base_pkg, *_base) in the same job.
#   run: bash tools/device_kernels.sh 560 device_decode_stages_job.sh   (carry .whl and scratch; call again to poll)
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_decode_kernel.py tests/test_delta_kernels.py \
  -k "tabled or ssd" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 420 python3 tools/sweep_kernels.py state_decode --batches 16 64 --jobs 16 --out "$W/sweep_decode.jsonl" \
  > "$W/sweep_decode.log" 2>&1
log "sweep rc $?"
python3 tools/sweep_kernels.py state_decode --write --from "$W/sweep_decode.jsonl" >> "$W/sweep_decode.log" 2>&1
log "write rc $?"
cp kernels/common/state_io.py "$W/state_io.py"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
export E2E_BATCHES="1 64" E2E_PROFILE=0
bash tools/device_gla_e2e.sh "$W"
E2E_TAG=_base PYTHONPATH="$BASE:$PYTHONPATH" bash tools/device_gla_e2e.sh "$W"
bash tools/device_hybrid_e2e.sh "$W"
E2E_TAG=_base PYTHONPATH="$BASE:$PYTHONPATH" bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
