#!/usr/bin/env bash
# Issue #14: GLA's quantized low-rank gate in the norm and the decode kernel: its GPU tests, then the graphed
# decode with the gate fused / its own kernel / in order / absent (tools/gate_bound_probe.py), alternated.
#   run: bash tools/device_kernels.sh 540 device_fused_gate_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -q -x tests/test_decode_kernel.py -k "low_rank or gated_output_norm or tabled" \
  > "$W/gpu_tests_kernels.log" 2>&1
log "kernel tests rc $?"
timeout 300 python3 -m pytest -q -x -m gpu tests/test_gla_model.py > "$W/gpu_tests_model.log" 2>&1
log "model tests rc $?"
PYTHONPATH="tools:.:${PYTHONPATH:-}" timeout 400 python3 tools/gate_bound_probe.py "$W/gate_fused.json" \
  > "$W/gate_fused.log" 2>&1
log "probe rc $?"
timeout 300 python3 -m pytest -q -x tests/test_fused_layer_ops.py > "$W/gpu_tests_rowwise.log" 2>&1
log "rowwise tests rc $?"
touch "$W/job.done"
