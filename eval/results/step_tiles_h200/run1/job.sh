#!/usr/bin/env bash
# Issue #14: the decode GEMMs' tiles (and the GLA decode kernel's launch) swept inside the graphed B = 64 step of the
# 1.37B GLA (tools/sweep_step_tiles.py), then the checks the last session left unrun on the decode kernels' early
# state loads: the model-level GPU tests (graphed == eager) and the Kimi Linear hybrid's e2e (KDA).
#   run: bash tools/device_kernels.sh 540 device_step_tiles_job.sh
set -u
. tools/device_job_env.sh "$@"
(cd tools && timeout 420 python3 sweep_step_tiles.py "$W/step_tiles_b64.json") > "$W/step_tiles_b64.log" 2>&1
log "step tiles b64 rc $?"
timeout 280 python3 -m pytest -q tests/test_gpu_model.py tests/test_graphed_step.py > "$W/gpu_tests_model.log" 2>&1
log "gpu tests model rc $?"
E2E_TIMEOUT=200 hybrid_e2e kimi_linear _new
touch "$W/job.done"
