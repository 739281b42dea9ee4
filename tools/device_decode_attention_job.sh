#!/usr/bin/env bash
# Issue #14: the static decode steps' attention as one Triton kernel (kernels/attention/decode.py). GPU tests of the
# kernel and of the static / graphed hybrid steps that now run it, the kernel against the eager formula it replaced
# (tools/bench_decode_attention.py), then the e2e decode of Zamba2, Falcon-H1 and qwen3_next (bf16 and hybrid_int8,
# prompt 1,024, B = 1 and 64), with scratch/base_pkg (the checkout before, first on PYTHONPATH) as *_base for two.
#   run: bash tools/device_kernels.sh 560 device_decode_attention_job.sh   (carry .whl and scratch)
set -u
. tools/device_job_env.sh "$@"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_decode_attention.py > "$W/gpu_tests_kernel.log" 2>&1
log "kernel tests rc $?"
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_static_hybrid.py tests/test_gated_attention.py \
  tests/test_graphed_step.py > "$W/gpu_tests_steps.log" 2>&1
log "step tests rc $?"
timeout 120 python3 tools/bench_decode_attention.py "$W/bench_decode_attention.json" > "$W/bench_decode_attention.log" 2>&1
log "bench rc $?"
QWEN='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
for tag in "" _base; do
  hybrid_e2e zamba2 "$tag" "" --no-profile
  hybrid_e2e qwen3_next "$tag" "$QWEN" --no-profile
done
hybrid_e2e falcon_h1 "" "" --no-profile
touch "$W/job.done"
