#!/usr/bin/env bash
# The int8 state's decode step (issues #14 / #19): staged variants of its arithmetic timed (tools/exp_state_step.py),
# then ncu's counters and per-instruction samples of the shipped decode kernel (fp32, int8 nearest, int8 stochastic;
# run 0 of eval/results/verify_numerics_h200/ ran the ncu part first, then the timing after a fix to the staged kernel).
#   run: bash tools/device_kernels.sh 420 device_state_step_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 tools/exp_state_step.py "$W/exp_state_step.json" > "$W/exp_state_step.log" 2>&1
log "exp rc $?"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 240 "$NCU" --clock-control none --set full --import-source yes -k regex:_gla_decode_kernel -o "$W/step" \
  python3 tools/exp_state_step.py --once > "$W/ncu_step.log" 2>&1
log "ncu rc $?"
"$NCU" -i "$W/step.ncu-rep" --page details > "$W/ncu_step_details.txt" 2>&1
"$NCU" -i "$W/step.ncu-rep" --page source --print-source sass --csv > "$W/ncu_step_sass.csv" 2>&1
gzip -f "$W/ncu_step_sass.csv"
log "ncu pages rc $?"
rm -f "$W/step.ncu-rep"
touch "$W/job.done"
