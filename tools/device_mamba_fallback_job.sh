#!/usr/bin/env bash
# Mamba2's gated norm as one kernel where out_proj takes no codes, and the recipe's weight-only fallback for the layers
# over outlier_max_fraction: Nemotron-H and Bamba e2e (bf16 vs hybrid_int8, graphed, B = 1 and 64, 1K prompt, the ~1B
# layouts of tools/family_configs.py) with the default recipe, with --set projections.outlier_fallback=weight_only,
# and on the checkout before (scratch/base_pkg first on PYTHONPATH: *_base); then the GPU tests.
#   run: bash tools/device_kernels.sh 540 device_mamba_fallback_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
E2E="--suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32"
for fam in nemotron_h bamba; do
  CFG=$(python3 tools/family_configs.py $fam)
  timeout 120 laquant eval speed $E2E --model "$fam:$CFG" --set projections.outlier_fallback=weight_only \
    --out "$W/e2e_${fam}_weight_only" > "$W/e2e_${fam}_weight_only.log" 2>&1
  log "$fam weight_only e2e rc $?"
  timeout 120 laquant eval speed $E2E --model "$fam:$CFG" --out "$W/e2e_${fam}" > "$W/e2e_${fam}.log" 2>&1
  log "$fam e2e rc $?"
  PYTHONPATH="$BASE:$PYTHONPATH" timeout 120 python3 -m laquant.cli eval speed $E2E --no-profile --model "$fam:$CFG" \
    --out "$W/e2e_${fam}_base" > "$W/e2e_${fam}_base.log" 2>&1
  log "$fam base e2e rc $?"
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_quantizing_rowwise.py tests/test_gemm_decode.py \
  -k "mamba_gated_norm or (gpu_codes and (nemotron_h or bamba)) or gpu_odd_shapes" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
