#!/usr/bin/env bash
# Issue #14: the int8 GEMMs past Triton's synchronous int8 wgmma (Triton makes a wgmma asynchronous only with a
# float32 accumulator, so each K step of the int8 dot waits for its own products). The 1.37B GLA's e2e at B = 64 with
# the committed tables; the decode sweep at M = 64 over the tiles that sidestep it (2 warps: mma.sync; 512-wide K
# steps: half the waits), the committed config timed in the same run; the prefill sweep at 4,096 rows with 256-wide K
# steps; the decode table with the sweep's winners (tools/sweep_gemm.py --apply), its GPU tests, and the e2e again.
#   run: bash tools/device_kernels.sh 560 device_gemm_unsync_job.sh
set -u
. tools/device_job_env.sh "$@"
export E2E_BATCHES="64"
E2E_TAG=_before bash tools/device_gla_e2e.sh "$W"
mkdir -p "$W/decode" "$W/prefill"
for i in $(seq 0 11); do
  python3 tools/sweep_gemm.py --unsync --buckets 64 --shapes gla --warm "$i/12" > "$W/decode/warm_$i.log" 2>&1 &
done
wait
log "decode warm done"
timeout 300 python3 tools/sweep_gemm.py --unsync --buckets 64 --shapes gla --out "$W/decode" > "$W/decode/sweep.log" 2>&1
log "decode sweep rc $?"
timeout 300 python3 tools/sweep_gemm_prefill.py "$W/prefill" --shapes gla --ms 4096 > "$W/prefill/sweep.log" 2>&1
log "prefill sweep rc $?"
python3 tools/sweep_gemm.py --apply "$W/decode/configs_table.py" && cp kernels/gemm/configs.py "$W/decode/configs.py"
log "apply rc $?"
git diff --stat kernels/gemm/configs.py > "$W/decode/configs_diff.txt" 2>&1
timeout 240 python3 -m pytest -q -rfs --tb=short tests/test_gemm_decode.py > "$W/gpu_tests_gemm.log" 2>&1
log "gemm tests rc $?"
E2E_TAG=_after bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
