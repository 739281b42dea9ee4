#!/usr/bin/env bash
# Issue #14: what the GLA decode step's low-rank gate costs in a graphed step (tools/gate_bound_probe.py)
#   run: bash tools/device_kernels.sh 300 device_gate_bound_job.sh
set -u
. tools/device_job_env.sh "$@"
PYTHONPATH="tools:.:${PYTHONPATH:-}" timeout 500 python3 tools/gate_bound_probe.py "$W/gate_bound.json" > "$W/gate_bound.log" 2>&1
log "probe rc $?"
touch "$W/job.done"
