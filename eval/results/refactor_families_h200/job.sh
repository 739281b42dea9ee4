#!/usr/bin/env bash
# Issue #14: the GPU tests of the decode kernels after the shared early-state helper (f163f04, checked offline only),
# then tools/sweep_step_tiles.py --write on Nemotron-H and Granite 4 (B = 64, tools/family_configs.py's configs) in a
# private package, each family's e2e with the swept package against this tree, and the written files.
#   run: bash tools/device_kernels.sh 560 device_refactor_families_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 330 python3 -m pytest -q -rfs --tb=short -x tests/test_decode_kernel.py tests/test_delta_kernels.py \
  tests/test_kda_kernels.py tests/test_graphed_step.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
FAMILIES=${FAMILIES:-nemotron_h granitemoehybrid}
private_pkg "$W/pkg"
for fam in $FAMILIES; do
  (cd tools && PYTHONPATH="$W/pkg:$PYTHONPATH" timeout 260 python3 sweep_step_tiles.py "$W/step_$fam.json" --write \
    --model "$fam:$(python3 family_configs.py "$fam")") > "$W/step_$fam.log" 2>&1
  log "sweep $fam rc $?"
done
cp "$W/pkg/laquant/kernels/gemm/configs.py" "$W/pkg/laquant/kernels/common/state_io.py" "$W/"
BASE="$W/pkg"
for fam in $FAMILIES; do
  E2E_TIMEOUT=150 hybrid_e2e "$fam" _base "$(python3 tools/family_configs.py "$fam")" --no-profile --batch 64
  mv "$W/e2e_${fam}_base" "$W/e2e_${fam}_swept"; mv "$W/e2e_${fam}_base.log" "$W/e2e_${fam}_swept.log"
  E2E_TIMEOUT=150 hybrid_e2e "$fam" _tree "$(python3 tools/family_configs.py "$fam")" --no-profile --batch 64
done
touch "$W/job.done"
