#!/usr/bin/env bash
# Issue #14's hybrid benchmark, one definition for the device jobs that run it: the e2e decode of the 1.14B dense
# qwen3_next (bf16 vs hybrid_int8, graphed, B = 1 and 64, prompt 1,024), then the graphed B = 64 step's kernel
# profile (tools/profile_hybrid_decode.py, the same config from eval/results/graphed_hybrid_h200/).
# $1: work folder (e2e_hybrid/, profile_hybrid_b64.json, their logs, status.log). $E2E_TAG, if set, ends the output
# names (another checkout timed in the same job, first on PYTHONPATH). E2E_PROFILE=0 skips the profile; $E2E_BATCHES:
# the decode batches (default "1 64").
set -u
W=${1:-$OUT}
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
timeout 600 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch ${E2E_BATCHES:-1 64} --prompt 1024 --gen 32 \
  --model "qwen3_next:$CONFIG" --out "$W/e2e_hybrid${E2E_TAG:-}" > "$W/e2e_hybrid${E2E_TAG:-}.log" 2>&1
log "hybrid e2e${E2E_TAG:-} rc $?"
[ "${E2E_PROFILE:-1}" = 0 ] && exit 0
BATCH=64 PROMPT=1024 timeout 300 python3 tools/profile_hybrid_decode.py "$W/profile_hybrid_b64${E2E_TAG:-}.json" \
  eval/results/graphed_hybrid_h200/qwen3_next_2048x16_config.json > "$W/profile_hybrid${E2E_TAG:-}.log" 2>&1
log "profile${E2E_TAG:-} rc $?"
