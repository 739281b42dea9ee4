#!/usr/bin/env bash
# Issue #14's GLA benchmark, one definition for the device jobs that run it: the e2e decode of a random GLA (bf16 vs
# gla_int8_all, graphed, B = 1 and 64, prompt 4,096) with its eager B = 64 step's kernel profile.
# $E2E_BATCHES: the decode batches (default "1 64"). $1: work folder; $2: the size, 1b (default: the 1.37B 2048x24; e2e_gla/, e2e_gla.log) or 7b (the 6.74B 4096x32,
# Llama-7B's widths; e2e_gla_7b/, e2e_gla_7b.log). A line in $1/status.log. $E2E_TAG, if set, ends the output names (another
# checkout timed in the same job: e2e_gla_base/ with that checkout first on PYTHONPATH).
set -u
W=${1:-$OUT}
SIZE=${2:-1b}
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
case "$SIZE" in
  1b) NAME=e2e_gla; LIMIT=600; LABEL="gla e2e"; CONFIG='{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}' ;;
  7b) NAME=e2e_gla_7b; LIMIT=1200; LABEL="gla 7b e2e"; CONFIG='{"hidden_size": 4096, "num_hidden_layers": 32, "num_heads": 32, "vocab_size": 32000}' ;;
  *) echo "device_gla_e2e.sh: size must be 1b or 7b, got '$SIZE'" >&2; exit 2 ;;
esac
timeout "$LIMIT" laquant eval speed --suite e2e --recipe gla_int8_all --batch ${E2E_BATCHES:-1 64} --prompt 4096 --gen 32 \
  --model "config:$CONFIG" --out "$W/$NAME${E2E_TAG:-}" > "$W/$NAME${E2E_TAG:-}.log" 2>&1
log "$LABEL${E2E_TAG:-} rc $?"
