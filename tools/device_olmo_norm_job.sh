#!/usr/bin/env bash
# OLMo hybrid's gated output norm writing o_proj's codes (issue #14): the GPU codes test of OLMo and Kimi Linear,
# then OLMo hybrid's e2e against the checkout before (scratch/base_pkg, first on PYTHONPATH) in the same job.
#   run: bash tools/device_kernels.sh 400 device_olmo_norm_job.sh   (carry .whl and scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_quantizing_rowwise.py tests/test_delta_gating.py \
  -k "gpu and (olmo or kimi) or gating" > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
for tag in "" _base; do
  [ -n "$tag" ] && export PYTHONPATH="$BASE:$PYTHONPATH"
  timeout 150 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
    --model "olmo_hybrid:$(python3 tools/family_configs.py olmo_hybrid)" --out "$W/e2e_olmo_hybrid$tag" \
    > "$W/e2e_olmo_hybrid$tag.log" 2>&1
  log "olmo_hybrid$tag e2e rc $?"
done
touch "$W/job.done"
