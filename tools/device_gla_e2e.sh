#!/usr/bin/env bash
# Issue #14's GLA benchmark, one definition for the device jobs that run it: the e2e decode of the random 1.37B GLA
# 2048x24 (bf16 vs gla_int8_all, graphed, B = 1 and 64, prompt 4,096) with its eager B = 64 step's kernel profile.
# $1: work folder (e2e_gla/, e2e_gla.log, a line in status.log).
set -u
W=${1:-$OUT}
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
timeout 600 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 4096 --gen 32 \
  --model 'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}' \
  --out "$W/e2e_gla" > "$W/e2e_gla.log" 2>&1
log "gla e2e rc $?"
