#!/usr/bin/env bash
# Issue #16 on the lent GPU: retrain gla-large and the qwen3next-small hybrid (concurrently), then
# decode-mode accuracy at 2K / 16K (and 64K with saturation counts):
# - the hybrid's runs decode on the eager loop (a Python step per token, ~9 ms on the GPU): they run
#   as CPU processes on the machine's spare cores, one per variant and text, merged at the end
#   (several eager processes sharing one GPU slow each other many times);
# - gla-large's on the GPU (graphed decode), after training (a training process beside a graphed
#   decode slows every replay many times).
# The hybrid's weights (about 20 MB) come back in the job's archive, for its 64K runs on another
# machine; gla-large's (98 MB) cannot, and are deleted. Each step appends to status.log.
# Run by `bash tools/device_kernels.sh WAIT device_long_context_job.sh` (carry .whl .devdata).
set -u
W=$1
M=/tmp/laq-models
mkdir -p "$M"
LC="python3 tools/long_context_eval.py"
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/versions.txt"
python3 -c "import torch, triton, transformers, fla; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__, 'fla', fla.__version__); import os; print('cpus', os.cpu_count())" >> "$W/versions.txt" 2>&1
log start
python3 tools/train.py model --size large --lr 1.5e-3 --time-budget "${LARGE_BUDGET:-480}" --data-dir .devdata \
  --tokenizer laquant/assets/gla-small --out "$M/gla-large" > "$W/train_large.log" 2>&1 &
large=$!
python3 tools/train.py model --arch qwen3_next --size small --lr 3e-3 --batch 16 --time-budget "${HYBRID_BUDGET:-300}" \
  --data-dir .devdata --tokenizer laquant/assets/gla-small --out "$W/qwen3next-small" > "$W/train_hybrid.log" 2>&1
log "hybrid trained rc $?"
# The hybrid on CPU: 2 threads a process; the 2K windows capped (the 16K ones are all 46-50 windows).
H="$W/qwen3next-small"
for data in wikitext2 gutenberg; do
  for v in "" hybrid_int8 hybrid_int8:fp8_row:nearest hybrid_int8:int8_row:nearest hybrid_int8:fp8_row:stochastic; do
    ref="--no-reference"; [ -z "$v" ] && ref=""
    tag="${data}_${v:-bf16}"; tag=${tag//:/_}
    OMP_NUM_THREADS=2 $LC --model "$H" --device cpu --data "$data" --contexts 2048 16384 --max-windows 24 \
      --variants $v $ref --out "$M/lc_hybrid_$tag" > "$W/lc_hybrid_$tag.log" 2>&1 &
  done
done
wait "$large"
log "gla-large trained rc $?"
mkdir -p "$W/gla-large"
cp "$M"/gla-large/*.json "$M"/gla-large/*.png "$W/gla-large/" 2>/dev/null
$LC --model "$M/gla-large" --out "$W/lc_gla-large" --contexts 2048 16384 --variants \
  gla_fp8_state:fp8_row:nearest gla_fp8_state:fp8_row:stochastic gla_fp8_state:int8_row:nearest \
  gla_fp8_state:int8_row:stochastic gla_int8 gla_int8_fp8 gla_int8_all > "$W/lc_gla-large.log" 2>&1
log "gla-large 2K/16K rc $?"
$LC --model "$M/gla-large" --out "$W/lc_gla-large_64k" --contexts 65536 --max-windows 1 --data wikitext2 \
  --variants gla_int8 gla_int8_fp8 gla_int8_all gla_fp8_state gla_bf16_state > "$W/lc_gla-large_64k.log" 2>&1
log "gla-large 64K rc $?"
if [ -n "${AFTER:-}" ]; then bash "tools/$AFTER" "$W/after" > "$W/after.log" 2>&1; log "after ($AFTER) rc $?"; fi
wait
log "hybrid CPU runs done"
$LC --out "$W/lc_hybrid" --merge "$M"/lc_hybrid_* > "$W/lc_hybrid_merge.log" 2>&1
log "hybrid merged rc $?"
rm -rf "$M"
touch "$W/job.done"
