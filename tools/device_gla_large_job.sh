#!/usr/bin/env bash
# Issue #16, gla-large alone on the lent GPU: train it with nothing else on the GPU (fla's training
# step beside another GPU process ran at ~50 s a step), then its decode-mode accuracy on the graphed
# loop: every 8-bit state format, nearest and stochastic, and the recipes at 2K; the defaults at 16K;
# gla_int8 at 64K; the weights are deleted at the end. Run by `bash tools/device_kernels.sh WAIT device_gla_large_job.sh` (carry .whl .devdata).
set -u
W=$1
M=/tmp/laq-models
mkdir -p "$M"
LC="python3 tools/long_context_eval.py"
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
log start
python3 tools/train.py model --size large --lr 1.5e-3 --steps "${STEPS:-970}" --data-dir .devdata \
  --tokenizer laquant/assets/gla-small --out "$M/gla-large" > "$W/train_large.log" 2>&1
log "gla-large trained rc $?"
mkdir -p "$W/gla-large"
cp "$M"/gla-large/*.json "$M"/gla-large/*.png "$W/gla-large/" 2>/dev/null
$LC --model "$M/gla-large" --out "$W/lc_gla-large_2k" --contexts 2048 --max-windows 64 --variants \
  gla_fp8_state:fp8_row:nearest gla_fp8_state:fp8_row:stochastic gla_fp8_state:int8_row:nearest \
  gla_fp8_state:int8_row:stochastic gla_int8 gla_int8_fp8 gla_int8_all > "$W/lc_gla-large_2k.log" 2>&1
log "gla-large 2K rc $?"
$LC --model "$M/gla-large" --out "$W/lc_gla-large_16k" --contexts 16384 --max-windows 16 --variants \
  gla_int8 gla_fp8_state:int8_row:stochastic gla_int8_fp8 > "$W/lc_gla-large_16k.log" 2>&1
log "gla-large 16K rc $?"
$LC --model "$M/gla-large" --out "$W/lc_gla-large_64k" --contexts 65536 --max-windows 1 --data wikitext2 \
  --variants gla_int8 > "$W/lc_gla-large_64k.log" 2>&1
log "gla-large 64K rc $?"
rm -rf "$M/gla-large"  # 98 MB: too large to travel back
[ -n "${NESTED:-}" ] || touch "$W/job.done"  # device_long_context_job.sh runs this job inside its own
