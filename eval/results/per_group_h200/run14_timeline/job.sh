#!/usr/bin/env bash
# Issue #14: where the graphed B = 64 step's wall clock goes (tools/graph_timeline.py: 10 replays under torch.profiler,
# each instant split among the kernels running then) for the 1.37B GLA in bf16, gla_int8_all per token and per group,
# after a 512-token prompt. The per-token timeline last came from output_norm_h200 (2026-12-02); per group had none.
#   run: bash tools/device_kernels.sh 400 device_group_timeline_job.sh
set -u
. tools/device_job_env.sh "$@"
PYTHONPATH="tools:${PYTHONPATH:-}" timeout 330 python3 tools/graph_timeline.py "$W/timeline.json" 24 \
  "bf16,gla_int8_all,gla_int8_all+projections.act_granularity=per_group" > "$W/timeline.log" 2>&1
log "timeline rc $?"
touch "$W/job.done"
