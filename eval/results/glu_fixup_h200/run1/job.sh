#!/usr/bin/env bash
# Issue #14 (written 2026-12-04, for a later session): the per-group MLP's gate/up GEMM writing down's codes in its
# split-K fixup (kernels/gemm/glu.py, opt-in LAQUANT_GLU_FIXUP=1), never run on a GPU when it landed. Its GPU tests
# and the per-group ones; the 1.37B GLA's per-group e2e at B = 1 and 64 without and with it, alternated; the graphed
# B = 64 step's timeline both ways.
#   run: bash tools/device_kernels.sh 560 device_glu_fixup_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_glu_fixup.py tests/test_per_group_gemm.py \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
rep=0
for flag in 0 1 1 0; do
  rep=$((rep + 1))
  LAQUANT_GLU_FIXUP=$flag timeout 200 laquant eval speed --suite e2e --recipe gla_int8_all \
    --set projections.act_granularity=per_group --batch 1 64 --prompt 1024 --gen 32 --no-profile --model "$CFG" \
    --out "$W/e2e_fixup${flag}_$rep" > "$W/e2e_fixup${flag}_$rep.log" 2>&1
  log "e2e fixup=$flag $rep rc $?"
done
for flag in 0 1; do
  LAQUANT_GLU_FIXUP=$flag PYTHONPATH="tools:${PYTHONPATH:-}" timeout 150 python3 tools/graph_timeline.py \
    "$W/timeline_fixup$flag.json" 24 "gla_int8_all+projections.act_granularity=per_group" \
    > "$W/timeline_fixup$flag.log" 2>&1
  log "timeline fixup=$flag rc $?"
done
touch "$W/job.done"
