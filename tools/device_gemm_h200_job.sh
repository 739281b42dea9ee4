#!/usr/bin/env bash
# Issue #14 on the hybrid's decode step: the short conv's decode token as one kernel (kernels/conv/short_conv.py)
# and a decode GEMM table swept on this GPU with the qwen3_next shapes (tools/sweep_gemm.py, configs.TABLES).
# Steps: the conv kernel's GPU tests; the sweep (--wide: warps, pipeline depths, 16-column tiles) and its table put
# into configs.py; the GEMM GPU tests on it; the hybrid e2e and its B = 64 profile (tools/device_hybrid_e2e.sh); the
# 1.37B GLA's e2e (gla_int8_all). Results under $1, one status line a step. (The first run, results in
# eval/results/short_conv_h200/run1, also ran the hybrid e2e before the sweep and swept without --wide.)
#   run: bash tools/device_kernels.sh 560 device_gemm_h200_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_short_conv.py > "$W/gpu_tests_conv.log" 2>&1
log "conv tests rc $?"
mkdir -p "$W/sweep"
for i in 0 1 2 3 4 5 6 7 8 9 10 11; do python3 tools/sweep_gemm.py --wide --warm $i/12 > "$W/sweep/warm_$i.log" 2>&1 & done
wait
log "sweep warm done"
timeout 1200 python3 tools/sweep_gemm.py --wide --out "$W/sweep" > "$W/sweep/sweep.log" 2>&1
log "sweep rc $?"
python3 tools/sweep_gemm.py --apply "$W/sweep/configs_table.py" && cp kernels/gemm/configs.py "$W/sweep/configs.py"
log "apply rc $?"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_gemm_decode.py tests/test_int8_gemm_kernel.py \
  > "$W/gpu_tests_gemm.log" 2>&1
log "gemm tests rc $?"
bash tools/device_hybrid_e2e.sh "$W"
bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
