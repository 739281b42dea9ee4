#!/usr/bin/env bash
# The Mamba2 families after the SSD kernel's dt treatment, the Mamba2 norms' codes and the bf16 y: GPU tests, the e2e
# decode (bf16 vs hybrid_int8, graphed, B = 1 and 64, prompt 1,024) of mamba2, nemotron_h, bamba and granitemoehybrid,
# and for bamba and granitemoehybrid the checkout before (scratch/base_pkg first on PYTHONPATH, *_base) in the same
# job; the mamba2 graphed step's kernels (tools/family_decode_diag.py). Carry scratch and .whl.
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 -m pytest -q tests/test_decode_kernel.py -p no:cacheprovider > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
export E2E_TIMEOUT=300
for fam in mamba2 nemotron_h bamba granitemoehybrid; do hybrid_e2e $fam ""; done
for fam in bamba granitemoehybrid; do hybrid_e2e $fam _base; done
FAMILY=mamba2 timeout 200 python3 tools/family_decode_diag.py "$W/diag_mamba2.json" > "$W/diag_mamba2.log" 2>&1
log "diag rc $?"
touch "$W/job.done"
