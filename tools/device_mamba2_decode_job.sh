#!/usr/bin/env bash
# Mamba2 decode (this tree against the checkout before, scratch/base_pkg first on PYTHONPATH; carry scratch and .whl):
# GPU tests of the SSD kernel's dt treatment and the Mamba2 norms' codes; per family (mamba2, nemotron_h) memory by
# phase and the graphed B = 1 / 64 step's time and kernels (tools/family_decode_diag.py); the mamba2 e2e; a GLA 4K
# prefill's host time (tools/prefill_host_diag.py).
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 300 python3 -m pytest -q tests/test_decode_kernel.py tests/test_quantizing_rowwise.py -p no:cacheprovider \
  > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
for fam in mamba2 nemotron_h; do
  FAMILY=$fam timeout 200 python3 tools/family_decode_diag.py "$W/diag_${fam}.json" > "$W/diag_${fam}.log" 2>&1
  log "$fam rc $?"
  PYTHONPATH="$BASE:$PYTHONPATH" FAMILY=$fam timeout 200 python3 tools/family_decode_diag.py \
    "$W/diag_${fam}_base.json" > "$W/diag_${fam}_base.log" 2>&1
  log "$fam base rc $?"
done
timeout 300 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "mamba2:$(python3 tools/family_configs.py mamba2)" --out "$W/e2e_mamba2" > "$W/e2e_mamba2.log" 2>&1
log "mamba2 e2e rc $?"
timeout 200 python3 tools/prefill_host_diag.py "$W/diag_host.json" > "$W/diag_host.log" 2>&1
log "host rc $?"
touch "$W/job.done"
