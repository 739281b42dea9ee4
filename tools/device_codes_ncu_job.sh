#!/usr/bin/env bash
# Why SwiGLU's codes cost 2.5x its bf16 output at a prefill's size: ncu's counters of the codes producers
# (tools/ncu_codes_producers.py) and the staged variants' timings (tools/exp_glu_codes.py).
#   run: bash tools/device_kernels.sh 400 device_codes_ncu_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 tools/exp_glu_codes.py "$W/exp_glu_codes.json" > "$W/exp_glu_codes.log" 2>&1
log "staged variants rc $?"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 300 "$NCU" --clock-control none --set full -k regex:'glu|swiglu|rms_norm|quantize_rows' \
  python3 tools/ncu_codes_producers.py > "$W/ncu.txt" 2> "$W/ncu.err"
log "ncu rc $? ($NCU)"
find ~/.triton/cache -name '_glu_codes_kernel.ptx' -o -name '_swiglu_kernel.ptx' | head -4 | while read -r f; do
  cp "$f" "$W/$(basename "$(dirname "$f")")_$(basename "$f")"; done
touch "$W/job.done"
