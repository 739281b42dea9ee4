#!/usr/bin/env bash
# Issue #14: GLA's gated output norm (and o_proj's codes) inside the decode kernel. The new kernel tests first, then
# the 1.37B GLA's e2e (bf16 vs gla_int8_all, graphed decode B = 1 and 64, 4K prompt) with the norm fused and with
# LAQUANT_FUSED_OUTPUT_NORM=0 (its own kernel after the decode step), alternated twice in this job, the graphed
# B = 64 step's timeline both ways, then the GPU tests of what the change touches.
#   run: bash tools/device_kernels.sh 560 device_output_norm_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_decode_kernel.py -k "output_norm" \
  tests/test_gla_model.py > "$W/gpu_tests_first.log" 2>&1
log "first tests rc $?"
for rep in 1 2; do
  E2E_TAG=_fused$rep bash tools/device_gla_e2e.sh "$W"
  LAQUANT_FUSED_OUTPUT_NORM=0 E2E_TAG=_unfused$rep bash tools/device_gla_e2e.sh "$W"
done
PYTHONPATH="tools:${PYTHONPATH:-}" timeout 240 python3 tools/graph_timeline.py "$W/timeline_fused.json" \
  > "$W/timeline_fused.log" 2>&1
log "timeline fused rc $?"
LAQUANT_FUSED_OUTPUT_NORM=0 PYTHONPATH="tools:${PYTHONPATH:-}" timeout 240 python3 tools/graph_timeline.py \
  "$W/timeline_unfused.json" > "$W/timeline_unfused.log" 2>&1
log "timeline unfused rc $?"
timeout 600 python3 -m pytest -q -rfs --tb=short tests/test_decode_kernel.py tests/test_gemm_decode.py \
  tests/test_graphed_step.py tests/test_generate.py tests/test_fused_layer_ops.py tests/test_stochastic_rounding.py \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
