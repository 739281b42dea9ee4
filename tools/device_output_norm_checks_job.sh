#!/usr/bin/env bash
# Issue #14, after tools/device_output_norm_job.sh: the GPU tests of the models cast after calibration (quantized
# modules keep their scales float32) and of the output norm's batch rule, then the 1.37B GLA's e2e on the final code.
#   run: bash tools/device_kernels.sh 560 device_output_norm_checks_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 120 python3 -m pytest -q -rfs --tb=short tests/test_decode_kernel.py -k "output_norm" \
  > "$W/gpu_tests_kernel.log" 2>&1
log "kernel tests rc $?"
timeout 360 python3 -m pytest -q -rfs --tb=short tests/test_gla_model.py tests/test_gpu_model.py \
  tests/test_quant_numerics.py tests/test_static_hybrid.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
E2E_TAG=_final bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
