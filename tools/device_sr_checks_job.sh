#!/usr/bin/env bash
# Issue #14 (2026-12-04), the last checks of the cheaper state rounding: gla_int8_all's perplexity on the trained
# gla-small through the GPU kernels (tools/ablation.py --device cuda; the CPU reference runs on the CPU machine), and
# the graphed B = 64 GLA step's timeline for bf16, gla_int8_all per token and per group (tools/graph_timeline.py,
# 512-token prompt), for b64_step_budget.md.
#   run: bash tools/device_kernels.sh 300 device_sr_checks_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 tools/ablation.py --device cuda --max-tokens 16384 --quiet --recipes gla_int8_all \
  --out "$W/ablation_gla-small_cuda" > "$W/ablation_cuda.log" 2>&1
log "ablation cuda rc $?"
PYTHONPATH="tools:${PYTHONPATH:-}" timeout 150 python3 tools/graph_timeline.py "$W/timeline.json" 24 \
  "bf16,gla_int8_all,gla_int8_all+projections.act_granularity=per_group" > "$W/timeline.log" 2>&1
log "timeline rc $?"
touch "$W/job.done"
