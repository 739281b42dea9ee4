#!/usr/bin/env bash
# Issue #14: tools/sweep_step_tiles.py --write at B = 64 on the hybrid families' e2e configs (tools/family_configs.py:
# FAMILIES below, the Mamba2 ones on the SSD decode kernel, OLMo hybrid's on the delta rule), each sweep starting from
# what the ones before kept, in a private copy of the package ($W/pkg: the device tool copies this machine's tree over
# the device's at every call); then each family's e2e with that package against this tree, and the written files.
#   run: bash tools/device_kernels.sh 560 device_step_tiles_families_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
FAMILIES=${FAMILIES:-mamba2 nemotron_h granitemoehybrid olmo_hybrid}
private_pkg "$W/pkg"
for fam in $FAMILIES; do
  (cd tools && PYTHONPATH="$W/pkg:$PYTHONPATH" timeout 300 python3 sweep_step_tiles.py "$W/step_$fam.json" --write \
    --model "$fam:$(python3 family_configs.py "$fam")") > "$W/step_$fam.log" 2>&1
  log "sweep $fam rc $?"
done
cp "$W/pkg/laquant/kernels/gemm/configs.py" "$W/pkg/laquant/kernels/common/state_io.py" "$W/"
BASE="$W/pkg"  # hybrid_e2e's "_base" runs $BASE: here the swept package, and "_tree" this tree
for fam in $FAMILIES; do
  E2E_TIMEOUT=150 hybrid_e2e "$fam" _base "$(python3 tools/family_configs.py "$fam")" --no-profile --batch 64
  mv "$W/e2e_${fam}_base" "$W/e2e_${fam}_swept"; mv "$W/e2e_${fam}_base.log" "$W/e2e_${fam}_swept.log"
  E2E_TIMEOUT=150 hybrid_e2e "$fam" _tree "$(python3 tools/family_configs.py "$fam")" --no-profile --batch 64
done
E2E_TIMEOUT=200 hybrid_e2e kimi_linear _tree  # with the committed delta-rule overlay (its e2e so far predates it)
touch "$W/job.done"
