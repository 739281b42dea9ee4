#!/usr/bin/env bash
# Issue #14: the hybrids' gated output norm in the delta-rule / KDA decode kernel: GPU tests, then graphed decode
# at B = 64 with the norm in the decode kernel / its own kernel, alternated (tools/output_norm_hybrid_probe.py).
#   run: bash tools/device_kernels.sh 540 device_hybrid_output_norm_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 -m pytest -q tests/test_delta_kernels.py -k "gated_output_norm or test_decode" \
  > "$W/gpu_tests_kernels.log" 2>&1
log "kernel tests rc $?"
timeout 150 python3 -m pytest -q tests/test_decode_kernel.py -k "output_norm" > "$W/gpu_tests_gla.log" 2>&1
log "gla kernel tests rc $?"
timeout 200 python3 -m pytest -q -m gpu tests/test_quantizing_rowwise.py > "$W/gpu_tests_model.log" 2>&1
log "model tests rc $?"
PYTHONPATH="tools:.:${PYTHONPATH:-}" timeout 420 python3 tools/output_norm_hybrid_probe.py "$W/hybrid_norm.json" \
  > "$W/hybrid_norm.log" 2>&1
log "probe rc $?"
touch "$W/job.done"
