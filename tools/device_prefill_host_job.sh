#!/usr/bin/env bash
# Where a quantized hybrid's eager prefill spends its host time (tools/prefill_host_diag.py): Nemotron-H and Bamba,
# 1,024 tokens, bf16 against hybrid_int8 (wall, host time with the GPU kept busy, syncs, time by module, cProfile).
set -u
. tools/device_job_env.sh "$@"
for fam in nemotron_h bamba; do
  FAMILY=$fam PROMPT=1024 timeout 200 python3 tools/prefill_host_diag.py "$W/prefill_host_$fam.json" \
    > "$W/prefill_host_$fam.log" 2>&1
  log "$fam rc $?"
done
touch "$W/job.done"
