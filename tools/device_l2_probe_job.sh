#!/usr/bin/env bash
# Issue #14: would the decode GEMMs gain from weights already in L2 (tools/l2_weights_probe.py)?
#   run: bash tools/device_kernels.sh 300 device_l2_probe_job.sh
set -u
. tools/device_job_env.sh "$@"
PYTHONPATH="tools:${PYTHONPATH:-}" timeout 400 python3 tools/l2_weights_probe.py "$W/l2_probe.json" > "$W/l2_probe.log" 2>&1
log "probe rc $?"
touch "$W/job.done"
