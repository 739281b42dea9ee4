#!/usr/bin/env bash
# transformers' generate on a left-padded batch (2026-12-04: graph steps for the hybrids' padded batches, padding
# masks for laquant's GLA): the GPU tests of the padded paths, then tokens/s with graph steps on and off
# (tools/bench_padded_generate.py) on the 1.37B GLA and the 1.14B qwen3_next, bf16 and quantized. Results under $1.
#   run: bash tools/device_kernels.sh 540 device_padded_generate_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -v -rfs --tb=short -m gpu -k "padded or padding" tests/test_graphed_step.py tests/test_generate.py \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
GLA='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
QWEN="qwen3_next:$(python3 tools/family_configs.py qwen3_next)"
timeout 420 python3 tools/bench_padded_generate.py "$W/padded_generate.json" "$GLA" "$QWEN" \
  > "$W/padded_generate.log" 2>&1
log "bench rc $?"
touch "$W/job.done"
