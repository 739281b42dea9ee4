#!/usr/bin/env bash
# Issue #14: projections.output_act_granularity=per_group (o_proj and down_proj per group, the rest per token) on the
# GPU: the per-group tests (both granularities), the 1.37B GLA's e2e with and without it, alternated, and the trained
# gla-small's perplexity through the GPU kernels (tools/ablation.py).
#   run: bash tools/device_kernels.sh 440 device_output_granularity_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_per_group_gemm.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
rep=0
for mode in token outputs outputs token; do
  rep=$((rep + 1))
  set_args=()
  [ "$mode" = outputs ] && set_args=(--set projections.output_act_granularity=per_group)
  timeout 80 laquant eval speed --suite e2e --recipe gla_int8_all "${set_args[@]}" --batch 1 64 --prompt 1024 \
    --gen 32 --no-profile --model "$CFG" --out "$W/e2e_${mode}_$rep" > "$W/e2e_${mode}_$rep.log" 2>&1
  log "e2e $mode $rep rc $?"
done
timeout 150 python3 tools/ablation.py --device cuda --out "$W/ablation_gla-small_cuda" --max-tokens 16384 \
  --recipes gla_int8_all gla_int8_all,projections.output_act_granularity=per_group > "$W/ablation.log" 2>&1
log "ablation rc $?"
touch "$W/job.done"
