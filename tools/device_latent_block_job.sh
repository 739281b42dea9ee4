#!/usr/bin/env bash
# The latent attention kernel with the swept 64-position blocks (bf16): its GPU tests, then Kimi Linear's e2e.
#   run: bash tools/device_kernels.sh 200 device_latent_block_job.sh   (carry .whl)
set -u
. tools/device_job_env.sh "$@"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_latent_attention.py > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
timeout 120 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 --no-profile \
  --model "kimi_linear:$(python3 tools/family_configs.py kimi_linear)" --out "$W/e2e_kimi_linear" \
  > "$W/e2e_kimi_linear.log" 2>&1
log "kimi_linear e2e rc $?"
touch "$W/job.done"
