#!/usr/bin/env bash
# Issue #16's 64K-token decodes of the trained qwen3next-small hybrid in $1, results under $2 (a device
# job's work folder; one status line a step in $2/status.log): the model's settings and checksum kept, one
# process per 8-bit hybrid recipe and one for the bf16 reference side by side (on CUDA each decodes on the
# graphed loop), merged into $2/lc_hybrid_64k. Called by device_64k_job.sh and device_graphed_hybrid_job.sh.
set -u
H=$1
W=$2
LC="python3 tools/long_context_eval.py"
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
mkdir -p "$W/qwen3next-small"
cp "$H"/*.json "$H"/*.png "$W/qwen3next-small/" 2>/dev/null
sha256sum "$H"/model.safetensors > "$W/qwen3next-small/sha256.txt"
parts=()
for v in hybrid_int8 hybrid_int8_fp8 hybrid_attention_w8a8; do
  $LC --model "$H" --data wikitext2 --contexts 65536 --max-windows 1 --variants "$v" --no-reference \
    --out "$W/lc_hybrid_64k_$v" > "$W/lc_hybrid_64k_$v.log" 2>&1 &
  parts+=("$W/lc_hybrid_64k_$v")
done
$LC --model "$H" --data wikitext2 --contexts 65536 --max-windows 1 --variants \
  --out "$W/lc_hybrid_64k_bf16" > "$W/lc_hybrid_64k_bf16.log" 2>&1 &
wait
log "hybrid 64K done"
$LC --out "$W/lc_hybrid_64k" --merge "$W/lc_hybrid_64k_bf16" "${parts[@]}" > "$W/lc_hybrid_64k_merge.log" 2>&1
log "hybrid 64K merged rc $?"
