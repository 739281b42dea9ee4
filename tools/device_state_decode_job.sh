#!/usr/bin/env bash
# Issue #14, the 8-bit state's decode step: tools/probe_state_decode.py (the delta-rule decode kernel
# per state format and launch blocks, one-pass blocks included, and the stochastic rounding's parts
# swapped out one at a time), then the GPU tests of the kernels and of the model paths on them.
# Run by `bash tools/device_kernels.sh WAIT device_state_decode_job.sh`. $1: work folder.
set -u
W=${1:-$OUT}
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
log start
for v in ${PROBE_VARIANTS:-base nearest_bits fast_round hash_bits hash_fast}; do
  python3 tools/probe_state_decode.py "$v" "$W/probe.jsonl" > "$W/probe_$v.log" 2>&1
  log "probe $v rc $?"
done
python3 -m pytest -q -rs -m gpu tests/test_delta_kernels.py tests/test_verify.py tests/test_kda_kernels.py \
  tests/test_quantizing_rowwise.py tests/test_static_hybrid.py tests/test_hybrid.py tests/test_gpu_model.py \
  tests/test_fused_layer_ops.py tests/test_speculative.py tests/test_generate.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
