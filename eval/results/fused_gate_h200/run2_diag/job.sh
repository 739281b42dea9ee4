#!/usr/bin/env bash
# Issue #14: where the fused low-rank gate's time goes: its kernels alone, then the graphed step's timeline with the
# gate fused and with its own kernel (B = 64 and 1).
#   run: bash tools/device_kernels.sh 400 device_fused_gate_diag_job.sh
set -u
. tools/device_job_env.sh "$@"
PYTHONPATH="tools:.:${PYTHONPATH:-}" timeout 200 python3 tools/fused_gate_kernels_probe.py "$W/kernels.json" \
  > "$W/kernels.log" 2>&1
log "kernels rc $?"
for B in 64 1; do
  for F in 1 0; do
    LAQUANT_FUSED_GATE=$F PYTHONPATH="tools:.:${PYTHONPATH:-}" timeout 200 python3 tools/graph_timeline.py \
      "$W/timeline_B${B}_fused$F.json" 24 gla_int8_all --batch $B > "$W/timeline_B${B}_fused$F.log" 2>&1
    log "timeline B=$B fused=$F rc $?"
  done
done
touch "$W/job.done"
