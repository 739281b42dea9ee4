#!/usr/bin/env bash
# Issue #14: the layer's gate as a parallel branch of the captured decode step (laquant/models/side_stream.py) and the
# codes of GEMMs with outlier columns gathered from registers (triton_numerics.gather_token_codes). Steps: the GPU tests
# of both; the codes producers timed alone (tools/bench_codes_producers.py); the 1.37B GLA e2e with both, with the
# branch off (LAQUANT_SIDE_STREAM=0), with PDL at every size (LAQUANT_PDL=all), and the checkout before the change
# (carried as scratch/base_pkg, first on PYTHONPATH: *_base outputs); the 1.14B qwen3_next e2e, new and base.
#   run: bash tools/device_kernels.sh 560 device_side_stream_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
timeout 420 python3 -m pytest -q -rfs --tb=short tests/test_side_stream.py tests/test_fused_layer_ops.py \
  tests/test_quantizing_rowwise.py > "$W/gpu_tests_kernels.log" 2>&1
log "kernel tests rc $?"
timeout 420 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_graphed_step.py tests/test_generate.py \
  tests/test_static_hybrid.py > "$W/gpu_tests_model.log" 2>&1
log "model tests rc $?"
bash tools/device_codes_bench.sh "$W"
bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
LAQUANT_SIDE_STREAM=0 E2E_TAG=_no_branch bash tools/device_gla_e2e.sh "$W"
LAQUANT_PDL=all E2E_TAG=_pdl_all bash tools/device_gla_e2e.sh "$W"
bash tools/device_hybrid_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
