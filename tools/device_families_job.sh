#!/usr/bin/env bash
# Issue #14, model coverage: the e2e decode (bf16 vs hybrid_int8, graphed, B = 1 and 64, prompt 1,024) of ~1B random
# models of the transformers hybrid families other than qwen3_next (tools/family_configs.py), none timed on a GPU before.
#   run: bash tools/device_kernels.sh 540 device_families_job.sh
set -u
. tools/device_job_env.sh "$@"
for fam in ${FAMILIES_TO_RUN:-kimi_linear nemotron_h granitemoehybrid olmo_hybrid bamba}; do
  timeout 400 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
    --model "$fam:$(python3 tools/family_configs.py "$fam")" --out "$W/e2e_$fam" > "$W/e2e_$fam.log" 2>&1
  log "$fam e2e rc $?"
done
touch "$W/job.done"
