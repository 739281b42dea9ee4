#!/usr/bin/env bash
# Issue #14: a hybrid's e2e decode with hybrid_int8 per token and per group (--set projections.act_granularity=
# per_group), bf16 beside each, on tools/family_configs.py's ~1B configs (HYBRIDS, default qwen3_next: the 1.14B
# hybrid target). Each step logs its end in status.log.
#   run: bash tools/device_kernels.sh 560 device_hybrid_per_group_job.sh
set -u
. tools/device_job_env.sh "$@"
for fam in ${HYBRIDS:-qwen3_next}; do
  hybrid_e2e "$fam" ""
  hybrid_e2e "$fam" _per_group "" --set projections.act_granularity=per_group
done
touch "$W/job.done"
