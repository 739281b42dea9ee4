#!/usr/bin/env bash
# The weight-only fallback's GEMM: tools/sweep_w8a16.py on Nemotron-H's and Bamba's fallback shapes (Mamba2 out_proj
# 4096 -> 2048, the MLPs' down_proj 8192 / 5632 -> 2048) at every decode bucket, its tiles applied to this copy's
# table, then Nemotron-H's and Bamba's e2e with --set projections.outlier_fallback=weight_only on them.
#   run: bash tools/device_kernels.sh 540 device_w8a16_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 330 python3 tools/sweep_w8a16.py --shapes 2048x4096,2048x5632 --out "$W/sweep" > "$W/sweep.log" 2>&1
log "sweep rc $?"
python3 tools/sweep_w8a16.py --apply "$W/sweep/w8a16_table.py" >> "$W/sweep.log" 2>&1 && cp kernels/gemm/configs.py "$W/"
log "apply rc $?"
E2E="--suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 --set projections.outlier_fallback=weight_only"
for fam in nemotron_h bamba; do
  CFG=$(python3 tools/family_configs.py $fam)
  timeout 120 laquant eval speed $E2E --model "$fam:$CFG" --out "$W/e2e_${fam}_weight_only" \
    > "$W/e2e_${fam}_weight_only.log" 2>&1
  log "$fam weight_only e2e rc $?"
done
touch "$W/job.done"
