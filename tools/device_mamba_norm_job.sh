#!/usr/bin/env bash
# Mamba2's grouped gated norm as one kernel writing out_proj's codes: Nemotron-H's e2e decode (bf16 vs hybrid_int8,
# graphed, B = 1 and 64, 1K prompt, the ~1B layout of tools/family_configs.py), the GPU tests, then the same e2e on
# the checkout before the change (scratch/base_pkg first on PYTHONPATH: *_base).
#   run: bash tools/device_kernels.sh 250 device_mamba_norm_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
CFG=$(python3 tools/family_configs.py nemotron_h)
timeout 110 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "nemotron_h:$CFG" --out "$W/e2e_nemotron_h" > "$W/e2e_nemotron_h.log" 2>&1
log "nemotron_h e2e rc $?"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_fused_layer_ops.py tests/test_quantizing_rowwise.py \
  -k "gate_first or (gpu_codes and (nemotron_h or bamba))" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 110 python3 -m laquant.cli eval speed --suite e2e --hybrid-recipe hybrid_int8 \
  --batch 1 64 --prompt 1024 --gen 32 --model "nemotron_h:$CFG" --out "$W/e2e_nemotron_h_base" > "$W/e2e_nemotron_h_base.log" 2>&1
log "nemotron_h base e2e rc $?"
touch "$W/job.done"
