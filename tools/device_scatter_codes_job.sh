#!/usr/bin/env bash
# Issue #14: the codes producers (norms, gated norm, SwiGLU) of a GEMM with outlier columns scatter the codes from
# their registers at decode sizes instead of reading their stored row back. Steps: their GPU tests; the producers
# timed alone and the 1.37B GLA / 1.14B qwen3_next e2e, this tree and the checkout before (scratch/base_pkg, first on
# PYTHONPATH: *_base); the graphed GLA step's timeline (tools/graph_timeline.py); the mamba2 e2e (fla imported);
# the host profile of a quantized 4K prefill.
#   run: bash tools/device_kernels.sh 560 device_scatter_codes_job.sh   (carry scratch, .whl)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_fused_layer_ops.py tests/test_quantizing_rowwise.py \
  tests/test_side_stream.py > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
bash tools/device_codes_bench.sh "$W"
bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
timeout 200 python3 tools/graph_timeline.py "$W/timeline.json" 24 gla_int8_all > "$W/timeline.log" 2>&1
log "timeline rc $?"
E2E_PROFILE=0 bash tools/device_hybrid_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base E2E_PROFILE=0 bash tools/device_hybrid_e2e.sh "$W"
timeout 240 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "mamba2:$(python3 tools/family_configs.py mamba2)" --out "$W/e2e_mamba2" > "$W/e2e_mamba2.log" 2>&1
log "mamba2 e2e rc $?"
CPROFILE=1 VARIANTS="bf16 gla_int8_all" timeout 200 python3 tools/profile_prefill.py "$W/prefill_host.json" 4096 \
  > "$W/prefill_host.log" 2>&1
log "prefill host rc $?"
touch "$W/job.done"
