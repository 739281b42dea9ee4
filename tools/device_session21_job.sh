#!/usr/bin/env bash
# Session of 2026-12-06 (twenty-first), ~8 minutes of device time, on an H100:
# 1. the GEMM GPU tests, which now ask the GPU for its shared memory (int8._tile_smem: never run on a GPU before),
#    and that query's answer beside tile_smem_budget's;
# 2. issue #14's GLA benchmark on this tree at 1.37B and at 7B widths (tools/device_gla_e2e.sh 1b / 7b), the 7B with
#    the 4096-wide H100 GEMM entries swept last session (eval/results/session20_h100/gemm_table_7b/), never run e2e;
# 3. the GLA decode kernel's launch sweep on the H100 (the table, state_io.DECODE_LAUNCH, was swept on an H200 and
#    serves every GPU): is another launch faster here?
#   bash tools/device_kernels.sh 560 device_session21_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
python3 -c "import torch; from laquant.kernels.gemm.int8 import _tile_smem; from triton.runtime import driver; \
p = driver.active.utils.get_device_properties(0); print(torch.cuda.get_device_name(), 'max_shared_mem', \
p['max_shared_mem'], '_tile_smem', _tile_smem(torch.device('cuda', 0)))" > "$W/tile_smem.txt" 2>&1
log "tile_smem rc $?"
timeout 300 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/test_gemm_decode.py \
  tests/test_int8_gemm_kernel.py > "$W/gpu_tests_gemm.log" 2>&1
log "gemm tests rc $?"
bash tools/device_gla_e2e.sh "$W" 1b
bash tools/device_gla_e2e.sh "$W" 7b
timeout 420 python3 tools/sweep_kernels.py state_decode --kernels gla --batches 1 16 64 --jobs 8 \
  --out "$W/decode_sweep_gla_h100.jsonl" > "$W/decode_sweep.log" 2>&1
log "decode sweep rc $?"
touch "$W/job.done"
