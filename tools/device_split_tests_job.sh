#!/usr/bin/env bash
# After the split prefill's fixes: the 64-token chunks at small K in bf16 (scratch/debug_split.py where carried), the
# delta-rule and KDA kernel tests on the GPU, and the mamba2 e2e (tools/family_configs.py).
#   run: bash tools/device_kernels.sh 540 device_split_tests_job.sh
set -u
. tools/device_job_env.sh "$@"
[ -f scratch/debug_split.py ] && timeout 100 python3 scratch/debug_split.py > "$W/debug.jsonl" 2>&1
timeout 200 python3 -m pytest -q tests/test_delta_kernels.py tests/test_kda_kernels.py -p no:cacheprovider \
  > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
timeout 200 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "mamba2:$(python3 tools/family_configs.py mamba2)" --out "$W/e2e_mamba2" > "$W/e2e_mamba2.log" 2>&1
log "mamba2 e2e rc $?"
touch "$W/job.done"
