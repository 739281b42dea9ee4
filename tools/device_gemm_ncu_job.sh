#!/usr/bin/env bash
# Where the decode-sized W8A8 GEMM waits (issue #14): ncu's counters and per-instruction stall samples of the split-K
# GEMM at M = 64 and 1 (tools/ncu_decode_gemm.py); the codes producers' staged variants (tools/exp_glu_codes.py).
#   run: bash tools/device_kernels.sh 420 device_gemm_ncu_job.sh
set -u
. tools/device_job_env.sh "$@"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 240 "$NCU" --clock-control none --set full --import-source yes -k regex:splitk -o "$W/gemm" \
  python3 tools/ncu_decode_gemm.py > "$W/ncu_gemm.log" 2>&1
log "ncu rc $?"
"$NCU" -i "$W/gemm.ncu-rep" --page details > "$W/ncu_gemm_details.txt" 2>&1
"$NCU" -i "$W/gemm.ncu-rep" --page source --print-source sass --csv > "$W/ncu_gemm_sass.csv" 2>&1
log "ncu pages rc $?"
rm -f "$W/gemm.ncu-rep"
timeout 200 python3 tools/exp_glu_codes.py "$W/exp_glu_codes.json" > "$W/exp_glu_codes.log" 2>&1
log "staged variants rc $?"
touch "$W/job.done"
