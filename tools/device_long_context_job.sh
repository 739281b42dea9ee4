#!/usr/bin/env bash
# Issue #16 on the lent GPU: retrain the qwen3next-small hybrid, then gla-large's job
# (device_gla_large_job.sh: train, decode-mode accuracy at 2K / 16K / 64K on the graphed loop), then
# the hybrid's 2K / 16K runs and its 64K runs. One GPU process at a time where timing matters: fla's training step
# beside another training ran at ~50 s a step, and a training process beside a graphed decode slows
# every replay many times (on 2026-11-26 the hybrid trained in 203 s, gla-large in 196 s, each alone).
# The hybrid decodes on the eager loop (a Python step per token, ~9 ms), one process per text side by
# side; its weights (about 20 MB) come back in the archive.
# Then $AFTER (a tools/ script, given the folder $W/after) if set. Each step appends to status.log.
# Run by `bash tools/device_kernels.sh WAIT device_long_context_job.sh` (carry .whl .devdata).
set -u
W=$1
LC="python3 tools/long_context_eval.py"
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/versions.txt"
python3 -c "import torch, triton, transformers, fla; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__, 'fla', fla.__version__)" >> "$W/versions.txt" 2>&1
log start
H="$W/qwen3next-small"
python3 tools/train.py model --arch qwen3_next --size small --lr 3e-3 --batch 16 --steps "${HYBRID_STEPS:-522}" \
  --data-dir .devdata --tokenizer laquant/assets/gla-small --out "$H" > "$W/train_hybrid.log" 2>&1
log "hybrid trained rc $?"
NESTED=1 bash tools/device_gla_large_job.sh "$W"
for data in wikitext2 gutenberg; do
  $LC --model "$H" --data "$data" --contexts 2048 16384 --max-windows 24 --variants hybrid_int8 \
    --out "$W/lc_hybrid_$data" > "$W/lc_hybrid_$data.log" 2>&1 &
done
wait
log "hybrid 2K/16K done"
$LC --model "$H" --contexts 2048 --max-windows 24 --variants hybrid_int8:fp8_row:nearest \
  hybrid_int8:int8_row:nearest hybrid_int8:fp8_row:stochastic --out "$W/lc_hybrid_formats" > "$W/lc_hybrid_formats.log" 2>&1
log "hybrid formats 2K rc $?"
# 64K of each hybrid recipe with an 8-bit state: finite, saturation counted (~10 min each, side by side)
for v in hybrid_int8 hybrid_int8_fp8; do
  $LC --model "$H" --data wikitext2 --contexts 65536 --max-windows 1 --variants "$v" --no-reference \
    --out "$W/lc_hybrid_64k_$v" > "$W/lc_hybrid_64k_$v.log" 2>&1 &
done
wait
log "hybrid 64K done"
if [ -n "${AFTER:-}" ]; then bash "tools/$AFTER" "$W/after" > "$W/after.log" 2>&1; log "after ($AFTER) rc $?"; fi
touch "$W/job.done"
