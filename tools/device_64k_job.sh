#!/usr/bin/env bash
# Issue #16's 64K-token decode of every recipe on gla-large and on the qwen3next-small hybrid: finite
# everywhere, saturation counted. Each model is retrained with the seeded command of its earlier
# results (reference_models.md; long_context_qwen3next-small_cpu.md), alone on the GPU, then decoded:
# gla-large on the graphed loop (one process), the hybrid by tools/hybrid_64k_decodes.sh (one process per
# recipe and one for the bf16 reference side by side, merged at the end). The weights stay
# on the lent machine. Run by `bash tools/device_kernels.sh WAIT device_64k_job.sh` (carry .whl .devdata;
# DATA_DIR=DIR reads the training text from DIR, for a tree too large to carry with it),
# polled with `JOB=device_64k_job bash tools/device_poll_lc.sh WAIT`. On a cold H200 (2026-11-27) gla-large
# trained in 607 s (fla autotuning) and its six 64K decodes took 10 minutes. The hybrid's part (HYBRID_ONLY=1)
# trained in 247 s on a warm H200, but its four eager 64K decodes side by side ran at 10-16 tokens/s each
# (2026-11-27, stopped at 3,000 tokens): 70-110 minutes, more than a session's device time. The hybrids
# now decode on the graphed loop (device_graphed_hybrid_job.sh ran these decodes in 5-6.5 minutes each).
set -u
W=$1
M=/tmp/laq-models
mkdir -p "$M"
LC="python3 tools/long_context_eval.py"
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/versions.txt"
python3 -c "import torch, triton, transformers, fla; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__, 'fla', fla.__version__)" >> "$W/versions.txt" 2>&1
log start
if [ -z "${HYBRID_ONLY:-}" ]; then  # HYBRID_ONLY=1: the hybrid's part alone (gla-large's ran on 2026-11-27)
python3 tools/train.py model --size large --lr 1.5e-3 --steps 970 --data-dir "${DATA_DIR:-.devdata}" \
  --tokenizer laquant/assets/gla-small --out "$M/gla-large" > "$W/train_large.log" 2>&1
log "gla-large trained rc $?"
mkdir -p "$W/gla-large"
cp "$M"/gla-large/*.json "$M"/gla-large/*.png "$W/gla-large/" 2>/dev/null
$LC --model "$M/gla-large" --out "$W/lc_gla-large_64k" --contexts 65536 --max-windows 1 --data wikitext2 \
  --variants gla_int8 gla_int8_all gla_int8_fp8 gla_fp8_state gla_bf16_state > "$W/lc_gla-large_64k.log" 2>&1
log "gla-large 64K rc $?"
rm -rf "$M/gla-large"
fi
H="$M/qwen3next-small"
python3 tools/train.py model --arch qwen3_next --size small --lr 3e-3 --batch 16 --steps 522 \
  --data-dir "${DATA_DIR:-.devdata}" --tokenizer laquant/assets/gla-small --out "$H" > "$W/train_hybrid.log" 2>&1
log "hybrid trained rc $?"
bash tools/hybrid_64k_decodes.sh "$H" "$W"
touch "$W/job.done"
