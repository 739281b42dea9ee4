#!/usr/bin/env bash
# Issue #14: the decode GEMM table for a 7B model's shapes on this GPU (tools/sweep_gemm.py --shapes 7b --wide, merged
# into configs.TABLES beside the 2048-wide entries), then the 6.9B GLA 4096x32 e2e on it (was 1.30x with the 2048-wide
# entries' tiles) and the 1.37B GLA e2e (its entries unchanged). Results under $1.
#   run: bash tools/device_kernels.sh 560 device_gemm_7b_job.sh
set -u
. tools/device_job_env.sh "$@"
mkdir -p "$W/sweep"
for i in 0 1 2 3 4 5 6 7 8 9 10 11; do
  python3 tools/sweep_gemm.py --shapes 7b --wide --warm $i/12 > "$W/sweep/warm_$i.log" 2>&1 &
done
wait
log "sweep warm done"
timeout 900 python3 tools/sweep_gemm.py --shapes 7b --wide --out "$W/sweep" > "$W/sweep/sweep.log" 2>&1
log "sweep rc $?"
python3 tools/sweep_gemm.py --apply "$W/sweep/configs_table.py" && cp kernels/gemm/configs.py "$W/sweep/configs.py"
log "apply rc $?"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_gemm_decode.py > "$W/gpu_tests_gemm.log" 2>&1
log "gemm tests rc $?"
bash tools/device_gla_e2e.sh "$W" 7b
bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
