#!/usr/bin/env bash
# The decode launch table by batch in the models: e2e decode (graphed, B = 1, 16, 64) of the 1.37B GLA (gla_int8_all)
# and the 1.14B qwen3_next (hybrid_int8), this tree and the checkout before (scratch/base_pkg first on PYTHONPATH,
# *_base) in the same job. Carry scratch and .whl.
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
export E2E_BATCHES="1 16 64" E2E_PROFILE=0
bash tools/device_gla_e2e.sh "$W"
E2E_TAG=_base PYTHONPATH="$BASE:$PYTHONPATH" bash tools/device_gla_e2e.sh "$W"
bash tools/device_hybrid_e2e.sh "$W"
E2E_TAG=_base PYTHONPATH="$BASE:$PYTHONPATH" bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
