#!/usr/bin/env bash
# The GPU tests of what was CPU-tested only (2026-11-30): the chunk / non-causal / delta-rule kernels and decode
# attention after `sizes.sm_count` replaced their device-property reads, the stored codes' smallest scales and the
# gated norm's several-token programs (review-added tests), then the n-gram / eval serve paths with --verify-numerics.
#   run: bash tools/device_kernels.sh 540 device_final_checks_job.sh
set -u
. tools/device_job_env.sh "$@"
for f in test_stored_codes test_fused_layer_ops test_decode_attention test_chunk_kernel test_linear_attention_kernel \
         test_delta_kernels test_ngram_draft; do
  timeout 150 python3 -m pytest -q -p no:cacheprovider -x "tests/$f.py" > "$W/gpu_$f.log" 2>&1
  log "$f rc $? $(tail -n 1 "$W/gpu_$f.log")"
done
touch "$W/job.done"
