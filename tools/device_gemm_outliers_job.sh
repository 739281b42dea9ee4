#!/usr/bin/env bash
# Issue #14: what the outlier columns cost the int8 GEMMs (tools/probe_gemm_outliers.py: the output tile as the
# outlier product's accumulator, against a copy of the kernel before), the GEMM tests on the GPU, then the 1.14B
# qwen3_next's e2e (bf16 vs hybrid_int8, prompt 1,024, B = 1 and 64) and its B = 64 step's and prefill's profile.
# Run by `bash tools/device_kernels.sh WAIT device_gemm_outliers_job.sh`. $1: work folder.
set -u
W=${1:-$OUT}
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)" > "$W/versions.txt" 2>&1
log start
timeout 300 python3 tools/probe_gemm_outliers.py "$W/probe_gemm_outliers.json" > "$W/probe_gemm_outliers.log" 2>&1
log "probe rc $?"
timeout 400 python3 -m pytest -q -rfs --tb=short tests/test_int8_gemm_kernel.py tests/test_gemm_decode.py \
  tests/test_fused_layer_ops.py > "$W/gpu_tests_gemm.log" 2>&1
log "gemm tests rc $?"
bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
