#!/usr/bin/env bash
# Issue #14, second run: the norms alone scatter the codes of a GEMM with outlier columns from their registers (SwiGLU
# reads them back again: scattered it was slower). Steps: the producers' GPU tests; the producers timed alone and the
# 1.37B GLA / 1.14B qwen3_next e2e, this tree and the checkout before (scratch/base_pkg, first on PYTHONPATH: *_base).
#   run: bash tools/device_kernels.sh 560 device_scatter_norms_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 200 python3 -m pytest -q -rfs --tb=short tests/test_fused_layer_ops.py > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
bash tools/device_codes_bench.sh "$W"
bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
for TAG in "" _base; do
  ( [ -n "$TAG" ] && export PYTHONPATH="$BASE:$PYTHONPATH"
    timeout 300 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
      --model "qwen3_next:$CONFIG" --out "$W/e2e_hybrid$TAG" > "$W/e2e_hybrid$TAG.log" 2>&1 )
  log "hybrid e2e$TAG rc $?"
done
touch "$W/job.done"
