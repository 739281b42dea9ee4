#!/usr/bin/env bash
# Issue #19: why the one-chunk verify (numerics "prefill") is slow at B = 64. tools/exp_verify_chunk.py (decode step,
# verify with both numerics, prefill over V blocks x warps; the e2e shapes) on the checkout before (scratch/base_pkg,
# cfaaf7f: base), on this one (new), and on two variants of it made here: `nofb` (the pairwise fallback of
# decayed_scores left out: `if True:`), `lowp` (the chunk kernels' products on bf16 operands instead of tf32x3); ncu of
# the new kernels (one launch each).
#   run: bash tools/device_kernels.sh 560 device_verify_chunk2_job.sh   (carry .whl and scratch)
set -u
. tools/device_job_env.sh "$@"
mkpkg() {  # mkpkg DIR: this checkout as a package folder (laquant/ with kernels, recipes inside), for PYTHONPATH
  rm -rf "$1" && mkdir -p "$1" && cp -r laquant "$1/" && cp -r kernels "$1/laquant/kernels" \
    && cp -r recipes "$1/laquant/recipes" && rm -rf "$1/laquant/kernels/__pycache__"
}
mkpkg /tmp/pkg_nofb
sed -i 's/        if tl.max(tile_row(G, rows, 0) - tile_row(G, rows, T - 1), axis=0) <= 60.0:/        if True:/' \
  /tmp/pkg_nofb/laquant/kernels/common/triton_numerics.py
grep -c "        if True:" /tmp/pkg_nofb/laquant/kernels/common/triton_numerics.py > "$W/nofb_applied.txt"
mkpkg /tmp/pkg_lowp
sed -i 's/, False, True)/, True, False)/g' /tmp/pkg_lowp/laquant/kernels/gla/verify.py \
  /tmp/pkg_lowp/laquant/kernels/delta/verify.py /tmp/pkg_lowp/laquant/kernels/common/triton_numerics.py
grep -c "True, False)" /tmp/pkg_lowp/laquant/kernels/*/verify.py > "$W/lowp_applied.txt"
timeout 120 python3 tools/exp_verify_chunk.py "$W/new.json" --formats int8_row:stochastic bf16 > "$W/new.log" 2>&1
log "new rc $?"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 120 python3 tools/exp_verify_chunk.py "$W/base.json" \
  --formats int8_row:stochastic bf16 > "$W/base.log" 2>&1
log "base rc $?"
for v in nofb lowp; do
  PYTHONPATH="/tmp/pkg_$v:$PYTHONPATH" timeout 100 python3 tools/exp_verify_chunk.py "$W/$v.json" \
    --formats int8_row:stochastic > "$W/$v.log" 2>&1
  log "$v rc $?"
done
for kern in gla delta; do
  timeout 100 ncu --clock-control none --set full -k regex:_${kern}_verify_chunk_kernel -c 1 -o "$W/ncu_$kern" \
    python3 tools/exp_verify_chunk.py --once --formats int8_row:stochastic > "$W/ncu_$kern.log" 2>&1
  log "ncu $kern rc $?"
  ncu --import "$W/ncu_$kern.ncu-rep" --page details > "$W/ncu_${kern}_details.txt" 2>&1
done
touch "$W/job.done"
