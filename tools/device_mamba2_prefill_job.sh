#!/usr/bin/env bash
# A Mamba-2 model's prefill (1.37B, 1K tokens: ~200 ms of GPU time in eval/results/scatter_codes_h200/): the kernels
# of a bf16 prefill by GPU time with the float32 scan's products on the tensor cores (tf32x3, this tree) and exact
# (the checkout before, scratch/base_pkg first on PYTHONPATH), then the GLA chunk kernel's GPU tests of the option.
#   run: bash tools/device_kernels.sh 220 device_mamba2_prefill_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 120 python3 tools/profile_mamba2_prefill.py "$W/mamba2_prefill.json" > "$W/mamba2_prefill.log" 2>&1
log "profile rc $?"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 120 python3 tools/profile_mamba2_prefill.py "$W/mamba2_prefill_base.json" \
  > "$W/mamba2_prefill_base.log" 2>&1
log "profile base rc $?"
timeout 150 python3 -m pytest -q -x tests/test_chunk_kernel.py -k "float32_products or prefill_matches or scalar" \
  -p no:cacheprovider > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
touch "$W/job.done"
