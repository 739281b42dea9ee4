#!/usr/bin/env bash
# Issue #14's accuracy check of the hybrid norms writing W8A8 codes: train qwen3next-small on the training
# text except gutenberg (the carry limit: .devdata/train's small files travel, gutenberg stays behind; an
# empty stand-in takes its place), then tools/norm_codes_ppl.py (hybrid_int8 perplexity with and without
# the fusion, prefill and decode). Run by `bash tools/device_kernels.sh WAIT device_norm_codes_job.sh`
# with carry .devdata/train/{us_presidential_speeches,genesis_en,movie_reviews,tinyshakespeare}.txt.xz.
set -u
W=${1:-$OUT}
D=/tmp/laq-data
M=/tmp/laq-models/qwen3next-small
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
mkdir -p "$D/train" "$D/calibration" "$(dirname "$M")"
cp .devdata/train/*.txt.xz "$D/train/"
[ -f "$D/train/gutenberg.txt.xz" ] || printf '' | xz > "$D/train/gutenberg.txt.xz"
cp laquant/assets/data/calibration/*.utf8 "$D/calibration/"
log start
python3 tools/train.py model --arch qwen3_next --size small --lr 3e-3 --batch 16 --steps "${STEPS:-300}" \
  --data-dir "$D" --tokenizer laquant/assets/gla-small --out "$M" > "$W/train_hybrid.log" 2>&1
log "trained rc $?"
cp "$M"/training.json "$W/" 2>/dev/null
python3 tools/norm_codes_ppl.py "$M" "$W/norm_codes_ppl.json" > "$W/norm_codes_ppl.log" 2>&1
log "ppl rc $?"
[ -n "${NESTED:-}" ] || touch "$W/job.done"
