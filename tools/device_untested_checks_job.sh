#!/usr/bin/env bash
# What 2026-11-30 (third session) shipped CPU-tested only, when its device time ran out: the graphed loop of laquant's
# GLA models with softmax attn layers (their keys in static buffers: tests/test_generate.py's GPU test); MiniMax's
# fused output norm (the gated norm kernel writing out_proj's codes) and graphed steps: their GPU tests, the e2e of
# the 1.43B MiniMax-style model (tools/family_configs.py) on this tree and on the checkout before the fused norm
# (scratch/base_pkg built from b1837e9, *_base); which of transformers' generate steps replay a graph at B = 1 and 64
# (tools/diag_hf_generate_steps.py: the e2e timed generate at 1.9K tok/s at B = 64); where its quantized eager
# prefill spends its host time (2.5x bf16's wall clock for the same GPU time, tools/prefill_host_diag.py).
#   run: bash tools/device_kernels.sh 560 device_untested_checks_job.sh   (carry .whl and scratch; call again to poll)
set -u
. tools/device_job_env.sh "$@"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_generate.py -k "gpu and attn_layers" \
  > "$W/gpu_tests_attn.log" 2>&1
log "attn gpu tests rc $?"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_quantizing_rowwise.py tests/test_static_hybrid.py \
  -k "minimax" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
E2E_TIMEOUT=230 hybrid_e2e minimax ""
E2E_TIMEOUT=230 hybrid_e2e minimax _base
FAMILY=minimax timeout 300 python3 tools/diag_hf_generate_steps.py "$W/hf_generate_steps.json" \
  > "$W/hf_generate_steps.log" 2>&1
log "hf generate steps rc $?"
FAMILY=minimax PROMPT=1024 timeout 200 python3 tools/prefill_host_diag.py "$W/prefill_host_minimax.json" \
  > "$W/prefill_host_minimax.log" 2>&1
log "prefill host rc $?"
touch "$W/job.done"
