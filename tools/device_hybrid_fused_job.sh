#!/usr/bin/env bash
# Issue #14 on the GPU, the hybrid's norms and SwiGLUs writing their projections' int8 codes
# (laquant.models.quantizing_rowwise): the GPU tests of the hybrids and of the handoff, the e2e decode of the
# 1.14B dense qwen3_next (bf16 vs hybrid_int8, graphed, B = 1 and 64; the same command as
# device_graphed_hybrid_job.sh), the graphed B = 64 step's kernel profile, then the accuracy check
# (device_norm_codes_job.sh: train qwen3next-small, hybrid_int8 perplexity with and without the fusion).
# Run by `bash tools/device_kernels.sh WAIT device_hybrid_fused_job.sh` with device_norm_codes_job.sh's carry.
set -u
. tools/device_job_env.sh "$@"
timeout 600 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_quantizing_rowwise.py tests/test_static_hybrid.py \
  tests/test_hybrid.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
bash tools/device_hybrid_e2e.sh "$W"
NESTED=1 bash tools/device_norm_codes_job.sh "$W"
touch "$W/job.done"
