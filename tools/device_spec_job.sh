#!/usr/bin/env bash
# Issue #19 on the GPU: the GPU tests of the verify step, speculative decoding (its rounds captured as
# CUDA graphs), generate's graphed loop, the prefix cache, eval ppl's graphed decode and the hybrids'
# static cache; then tools/bench_verify.py's speculative decoding at B = 1 (the shipped gla-small as
# gla_int8 drafted by itself, and a random 1.3B-shaped GLA target for the round time), then the
# hybrid decode profile's kernel summary. Run by `bash tools/device_kernels.sh WAIT device_spec_job.sh`.
# $1: work folder, where the logs, bench_verify/verify.{json,md} and the profile land.
set -u
W=${1:-$OUT}
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
log start
python3 -m pytest -q -rs -m gpu tests/test_verify.py tests/test_speculative.py tests/test_generate.py \
  tests/test_prefix_cache.py tests/test_eval_ppl.py tests/test_static_hybrid.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
python3 tools/bench_verify.py --out "$W/bench_verify" --no-kernels --draft-tokens 2 4 8 \
  --timing-target '{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16}' > "$W/bench_verify.log" 2>&1
log "bench_verify rc $?"
BATCH=64 PROMPT=1024 python3 tools/profile_hybrid_decode.py "$W/profile_hybrid.json" \
  eval/results/graphed_hybrid_h200/qwen3_next_2048x16_config.json > "$W/profile_hybrid.log" 2>&1
log "profile_hybrid rc $?"
touch "$W/job.done"
