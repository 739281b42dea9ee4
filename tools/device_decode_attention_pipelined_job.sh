#!/usr/bin/env bash
# Issue #14: the decode attention kernel with its position loop free of branches (a first pass over the mask finds
# the last visible position), so that Triton pipelines the key / value loads: its GPU tests, the kernel bench, and the
# e2e of Zamba2 and qwen3_next against scratch/base_pkg (the kernel with the skip test inside the loop).
#   run: bash tools/device_kernels.sh 540 device_decode_attention_pipelined_job.sh   (carry .whl and scratch)
set -u
. tools/device_job_env.sh "$@"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_decode_attention.py > "$W/gpu_tests_kernel.log" 2>&1
log "kernel tests rc $?"
timeout 120 python3 tools/bench_decode_attention.py "$W/bench_decode_attention.json" > "$W/bench_decode_attention.log" 2>&1
log "bench rc $?"
QWEN='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
for tag in "" _base; do
  hybrid_e2e zamba2 "$tag" "" --no-profile
  hybrid_e2e qwen3_next "$tag" "$QWEN" --no-profile
done
touch "$W/job.done"
