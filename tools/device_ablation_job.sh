#!/usr/bin/env bash
# Issue #14: what each part of the graphed B = 64 GLA step adds to its critical path (tools/step_ablation.py): the
# step without the gate's kernel, with the gate in order instead of on the side stream, and without each kernel
# class's launches, per token, per group and bf16.
#   run: bash tools/device_kernels.sh 560 device_ablation_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
SKIPS=skip:_gla_decode_kernel,skip:_rms_norm_kernel,skip:_rms_norm_group_kernel,skip:_swiglu_kernel,skip:_glu_group_kernel
SKIPS=$SKIPS,skip:_splitk_gemm_kernel,skip:_low_rank_gate_kernel
for v in gla_int8_all gla_int8_all+projections.act_granularity=per_group bf16; do
  tag=${v//[^a-z0-9_]/_}
  PYTHONPATH="tools:${PYTHONPATH:-}" timeout 170 python3 tools/step_ablation.py "$W/ablation_$tag.json" --variant "$v" \
    --ablations "none,no_gate,in_order,$SKIPS" --rounds 2 > "$W/ablation_$tag.log" 2>&1
  log "ablation $v rc $?"
done
touch "$W/job.done"
