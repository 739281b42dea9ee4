#!/usr/bin/env bash
# Issue #14: the fused low-rank gate's tiles at the 1.37B and 6.9B GLA widths (tools/sweep_low_rank_gate.py; 14 us
# a call at 4096 -> 16 -> 2048 in the 7B's step). Results under $1.   run: bash tools/device_kernels.sh 560 device_gate_sweep_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 500 python3 tools/sweep_low_rank_gate.py --out "$W/sweep" > "$W/sweep.log" 2>&1
log "gate sweep rc $?"
touch "$W/job.done"
