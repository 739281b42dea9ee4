#!/usr/bin/env bash
# Issue #16 on the lent GPU: retrain gla-large and the qwen3next-small hybrid (concurrently), then
# decode-mode accuracy at 2K / 16K (and 64K with saturation counts) of the state variants on the
# hybrid (eager decode: one process per variant, while gla-large trains), then on gla-small and
# gla-large (graphed decode, after training: a CUDA-graph replay per token is slowed many times by a
# training process beside it). Run by `bash tools/device_kernels.sh WAIT device_long_context_job.sh`
# (carry .whl .devdata). The weights stay outside $W (they do not travel back) and are deleted at the end.
W=$1
M=/tmp/laq-models
mkdir -p "$M"
set -x
python3 tools/train.py model --size large --lr 1.5e-3 --data-dir .devdata --tokenizer laquant/assets/gla-small \
  --out "$M/gla-large" > "$W/train_large.log" 2>&1 &
large=$!
python3 tools/train.py model --arch qwen3_next --size small --lr 3e-3 --batch 16 --time-budget 240 --data-dir .devdata \
  --tokenizer laquant/assets/gla-small --out "$M/qwen3next-small" > "$W/train_hybrid.log" 2>&1
cp "$M"/qwen3next-small/*.json "$M"/qwen3next-small/*.png "$W/" 2>/dev/null
for v in hybrid_int8 hybrid_int8:int8_row:stochastic hybrid_int8:fp8_row:stochastic; do
  python3 tools/long_context_eval.py --model "$M/qwen3next-small" --out "$W/lc_hybrid_${v//:/_}" --contexts 2048 16384 \
    --data wikitext2 --max-windows 64 --variants "$v" > "$W/lc_hybrid_${v//:/_}.log" 2>&1 &
done
for s in fp8_row:nearest int8_row:stochastic; do
  python3 tools/long_decode.py "$M/qwen3next-small" --recipe hybrid_int8 --set "state.format=${s%%:*}" \
    --set "state.rounding=${s##*:}" --tokens 65536 --batch 2 --device cuda --quiet \
    --out "$W/long_decode_hybrid_${s//:/_}" > "$W/long_decode_hybrid_${s//:/_}.log" 2>&1 &
done
wait "$large"
mkdir -p "$W/gla-large"
cp "$M"/gla-large/*.json "$M"/gla-large/*.png "$W/gla-large/" 2>/dev/null
python3 tools/long_context_eval.py --out "$W/lc_gla-small_64k" --contexts 65536 --max-windows 1 --data wikitext2 \
  --variants gla_int8 gla_int8_fp8 gla_int8_all gla_fp8_state gla_bf16_state > "$W/lc_gla-small_64k.log" 2>&1
python3 tools/long_context_eval.py --model "$M/gla-large" --out "$W/lc_gla-large" --contexts 2048 16384 \
  --variants gla_int8 gla_int8_fp8 gla_int8_all gla_fp8_state:int8_row:stochastic > "$W/lc_gla-large.log" 2>&1
python3 tools/long_context_eval.py --model "$M/gla-large" --out "$W/lc_gla-large_64k" --contexts 65536 --max-windows 1 \
  --data wikitext2 --variants gla_int8 gla_int8_fp8 > "$W/lc_gla-large_64k.log" 2>&1
wait
rm -rf "$M"
touch "$W/job.done"
