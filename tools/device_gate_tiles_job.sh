#!/usr/bin/env bash
# Issue #14: the fused low-rank gate's decode tiles from tools/sweep_low_rank_gate.py (1,024-wide K steps, 64-column
# blocks above 16 tokens). Steps: the gate's kernel tests and the model's GPU tests; the 6.9B and the 1.37B GLA e2e.
# Results under $1.   run: bash tools/device_kernels.sh 560 device_gate_tiles_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_fused_layer_ops.py tests/test_gpu_model.py \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
bash tools/device_gla_e2e.sh "$W" 7b
bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
