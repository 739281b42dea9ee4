#!/usr/bin/env bash
# Issue #14: where the quantized GLA reaches 2x. The e2e decode of a random 6.9B GLA 4096x32 (Llama-7B-like widths:
# 32 heads, SwiGLU 11,008; bf16 vs gla_int8_all, graphed, B = 1 and 64, prompt 4,096), beside the 1.37B 2048x24 of
# tools/device_gla_e2e.sh; first the GPU test of an MLP wider than the codes kernels (the 7B's 11,008). Results under $1.   run: bash tools/device_kernels.sh 560 device_gla_7b_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_gpu_model.py -k "wider" > "$W/gpu_tests_wide.log" 2>&1
log "wide mlp gpu test rc $?"
bash tools/device_gla_e2e.sh "$W" 7b
touch "$W/job.done"
