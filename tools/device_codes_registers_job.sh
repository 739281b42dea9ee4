#!/usr/bin/env bash
# Issue #14: the producers of a W8A8 GEMM's codes (norms, gated norm, SwiGLU) quantize the row they hold in registers
# where the GEMM keeps every column in order, instead of storing it, waiting on a barrier and gathering it back
# through the packed column map (kept for GEMMs with outlier columns); quantize_rows loads such rows plainly. Steps:
# the kernel tests of the codes paths and the GPU model tests; the producers timed alone
# (tools/bench_codes_producers.py); the 1.37B GLA and the 1.14B qwen3_next e2e. The bench and the GLA e2e also run the
# checkout before the change (carried as scratch/base_pkg, first on PYTHONPATH: *_base outputs). Results under $1.
#   run: bash tools/device_kernels.sh 560 device_codes_registers_job.sh
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
timeout 600 python3 -m pytest -q -rfs --tb=short tests/test_fused_layer_ops.py tests/test_int8_gemm_kernel.py \
  tests/test_quantizing_rowwise.py tests/test_gated_attention.py tests/test_gpu_model.py > "$W/gpu_tests_kernels.log" 2>&1
log "kernel and model tests rc $?"
bash tools/device_codes_bench.sh "$W"
bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
