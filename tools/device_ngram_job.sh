#!/usr/bin/env bash
# Issue #19: speculative decoding with prompt lookup (draft "ngram", laquant/serving/ngram.py) at B = 1. Steps: the GPU
# tests of the n-gram rounds, speculative decoding and the side stream; tools/bench_verify.py with --draft ngram on the
# shipped gla-small quantized with gla_int8 (five WikiText-2 prompts, k = 2, 4, 8; plus a random 1.3B-shaped GLA for
# the round time of a weight-bound target) and unquantized (the same five prompts), and the gla_int8 target drafted
# by its unquantized self on the same prompts (the model draft, for comparison).
#   run: bash tools/device_kernels.sh 560 device_ngram_job.sh   (SKIP_MODEL_DRAFT=1: not the model draft;
#   SKIP_TIMING_TARGET=1: not the random 1.3B target; NGRAM_TESTS_ONLY=1: only tests/test_ngram_draft.py)
set -u
. tools/device_job_env.sh "$@"
if [ -n "${NGRAM_TESTS_ONLY:-}" ]; then
  timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_ngram_draft.py > "$W/gpu_tests.log" 2>&1
else
  timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_ngram_draft.py tests/test_side_stream.py \
    > "$W/gpu_tests.log" 2>&1
  timeout 300 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_speculative.py >> "$W/gpu_tests.log" 2>&1
fi
log "gpu tests rc $?"
OFFSETS="0 5000 20000 40000 60000"
TIMING=(--timing-target '{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16}')
[ -n "${SKIP_TIMING_TARGET:-}" ] && TIMING=()
timeout 500 python3 tools/bench_verify.py --out "$W/ngram_int8" --no-kernels --draft ngram --draft-tokens 2 4 8 \
  --prompt-offsets $OFFSETS "${TIMING[@]}" > "$W/ngram_int8.log" 2>&1
log "ngram gla_int8 rc $?"
timeout 300 python3 tools/bench_verify.py --out "$W/ngram_bf16" --no-kernels --draft ngram --draft-tokens 2 4 8 \
  --recipe '' --prompt-offsets $OFFSETS > "$W/ngram_bf16.log" 2>&1
log "ngram bf16 rc $?"
if [ -z "${SKIP_MODEL_DRAFT:-}" ]; then
  timeout 300 python3 tools/bench_verify.py --out "$W/model_draft_int8" --no-kernels --draft-tokens 4 \
    --prompt-offsets $OFFSETS > "$W/model_draft_int8.log" 2>&1
  log "model draft rc $?"
fi
touch "$W/job.done"
