#!/usr/bin/env bash
# Issue #14, model coverage: where the graphed B = 1 decode step of the families that decode slower quantized than
# in bf16 goes (tools/profile_hybrid_decode.py with FAMILY=..., tools/family_configs.py's ~1B configs, 1K prompt).
#   run: bash tools/device_kernels.sh 540 device_family_profile_job.sh
set -u
. tools/device_job_env.sh "$@"
for fam in ${FAMILIES_TO_RUN:-nemotron_h bamba kimi_linear}; do
  FAMILY=$fam BATCH=${BATCH:-1} PROMPT=1024 timeout 300 python3 tools/profile_hybrid_decode.py "$W/profile_$fam.json" \
    > "$W/profile_$fam.log" 2>&1
  log "$fam profile rc $?"
done
touch "$W/job.done"
