#!/usr/bin/env bash
# OLMo hybrid's gated output norm writing o_proj's codes (issue #14): the GPU codes test of OLMo and Kimi Linear,
# then OLMo hybrid's e2e against the checkout before (scratch/base_pkg, first on PYTHONPATH) in the same job.
#   run: bash tools/device_kernels.sh 400 device_olmo_norm_job.sh   (carry .whl and scratch)
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_quantizing_rowwise.py tests/test_delta_gating.py \
  -k "gpu and (olmo or kimi) or gating" > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
hybrid_e2e olmo_hybrid ""
hybrid_e2e olmo_hybrid _base
touch "$W/job.done"
