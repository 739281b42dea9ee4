#!/usr/bin/env bash
# The GPU tests added last in the session of 2026-12-02: a gla_int8_all checkpoint loaded by transformers in bf16
# decodes on the kernels; the output-norm model tests again.
#   run: bash tools/device_kernels.sh 240 device_from_pretrained_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 -m pytest -q -rfs --tb=short tests/test_gla_model.py -k "gpu" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
