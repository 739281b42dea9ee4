#!/usr/bin/env bash
# The SSD decode step's few-programs launch (one block a head at B = 1): its GPU tests, then the Mamba-2 and
# Nemotron-H e2e decode (bf16 vs hybrid_int8, graphed, B = 1 and 64, prompt 1,024).
set -u
. tools/device_job_env.sh "$@"
timeout 150 python3 -m pytest -q tests/test_decode_kernel.py -p no:cacheprovider > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
for fam in mamba2 nemotron_h; do
  timeout 200 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
    --model "$fam:$(python3 tools/family_configs.py "$fam")" --out "$W/e2e_$fam" > "$W/e2e_$fam.log" 2>&1
  log "$fam e2e rc $?"
done
touch "$W/job.done"
