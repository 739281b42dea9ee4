#!/usr/bin/env bash
# Issue #14, the next GPU numbers after the 2026-12-03 sessions, most needed first (each step logs its end in status.log):
#  1. the consuming GEMM of the per-group route (eval/results/b64_step_budget.md, "The route that stays open"): per-128-
#     group scales applied in the loop (probe's codes) against today's per-token int32 sums (token_codes), one harness;
#  2. the headline again (not re-measured since 2026-12-02): the 1.37B GLA's e2e decode, bf16 vs gla_int8_all, B = 1
#     and 64, with its B = 64 step's kernel profile.
#   run: bash tools/device_kernels.sh 560 device_group_codes_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 480 python3 tools/probe_group_quant_gemm.py --out "$W/group_quant_gemm" > "$W/group_quant_gemm.log" 2>&1
log "group quant gemm probe rc $?"
bash tools/device_gla_e2e.sh "$W" 1b
touch "$W/job.done"
