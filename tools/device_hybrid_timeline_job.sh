#!/usr/bin/env bash
# Issue #14: where the graphed B = 64 decode step of Zamba2 (1.2B) and Falcon-H1 (1.83B) goes, bf16 and hybrid_int8
# (tools/graph_timeline.py --model, prompt 1,024), and whether an fp8 dot would stream the decode-size GEMM faster
# than the int8 one (tools/probe_gemm_dot.py).   run: bash tools/device_kernels.sh 560 device_hybrid_timeline_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 150 python3 tools/probe_gemm_dot.py "$W/gemm_dot.json" > "$W/gemm_dot.log" 2>&1
log "gemm probe rc $?"
for fam in zamba2 falcon_h1; do
  timeout 200 python3 tools/graph_timeline.py "$W/timeline_$fam.json" --prompt 1024 \
    --model "$fam:$(python3 tools/family_configs.py $fam)" > "$W/timeline_$fam.log" 2>&1
  log "$fam timeline rc $?"
done
touch "$W/job.done"
