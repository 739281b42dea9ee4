#!/usr/bin/env bash
# Issue #19's serve replay with prompt-lookup speculation, one definition for the device jobs that run it: `laquant
# eval serve` on gla-small and its gla_int8 form (4 conversations x 3 turns, a 4K shared system prompt, k = 8, no
# accuracy pass). $1: work folder (serve_ngram/, serve_ngram.log, a line in status.log); $2: the time limit in s.
set -u
W=${1:-$OUT}
LIMIT=${2:-300}
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
timeout "$LIMIT" python3 -m laquant.cli eval serve --recipe gla_int8 --system 4096 --user 64 --reply 32 \
  --conversations 4 --turns 3 --block-size 256 --reps 5 --device cuda --no-accuracy --draft ngram --draft-tokens 8 \
  --quiet --out "$W/serve_ngram" > "$W/serve_ngram.log" 2>&1
log "serve ngram rc $?"
