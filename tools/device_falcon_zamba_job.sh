#!/usr/bin/env bash
# The two Mamba2 families never timed on a GPU, Falcon-H1 (1.83B) and Zamba2 (1.2B-style), tools/family_configs.py:
# e2e decode (bf16 vs hybrid_int8, graphed, B = 1 and 64, prompt 1,024). Carry .whl (eval speed imports fla).
set -u
. tools/device_job_env.sh "$@"
for fam in falcon_h1 zamba2; do
  timeout 150 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
    --model "$fam:$(python3 tools/family_configs.py "$fam")" --out "$W/e2e_$fam" > "$W/e2e_$fam.log" 2>&1
  log "$fam e2e rc $?"
done
touch "$W/job.done"
