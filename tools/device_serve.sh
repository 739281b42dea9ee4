#!/usr/bin/env bash
# Issue #19 (prefix state cache) on the GPU: its tests, the follow-up TTFT with a 4K shared prefix
# (gla-small and a random 1.3B-shaped GLA, each bf16 and gla_int8), and the loss change of resuming
# from an 8-bit snapshot on the trained gla-small. Usage: tools/device_serve.sh OUT_DIR
set -x
W=${1:?usage: tools/device_serve.sh OUT_DIR}
mkdir -p "$W"
python3 -m pytest -q -rs tests/test_prefix_cache.py tests/test_prefix_cache_hybrid.py tests/test_chunk_kernel.py 2>&1 | tee "$W/prefix_cache_tests.log"
python3 -m laquant.cli eval serve --recipe gla_int8 --system 4096 --user 64 --reply 32 --conversations 4 --turns 3 \
  --block-size 256 --reps 10 --device cuda --accuracy-prefix 1024 --accuracy-len 2048 --accuracy-windows 32 \
  --draft gla-small --draft-tokens 4 \
  --quiet --out "$W/serve_gla_small" || echo "eval serve failed: gla-small"
python3 -m laquant.cli eval serve \
  'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 4, "vocab_size": 32000}' \
  --recipe gla_int8 --system 4096 --user 64 --reply 32 --conversations 4 --turns 3 --block-size 256 --reps 10 \
  --device cuda --quiet --out "$W/serve_gla_1b" || echo "eval serve failed: random 1.3B GLA"
