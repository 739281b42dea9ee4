#!/usr/bin/env bash
# The codes producers' quantization in a third of the instructions (triton_numerics.stored_int8_codes: the exactly
# rounded quotient from the row's reciprocal and one residual step, int8 from float32's bits) and the norms' prefill
# codes path (two tokens a program). Steps: GPU tests (the quotient's exactness over every bf16 value and
# near every rounding boundary, the producers, the int8 GEMMs, the hybrids' codes paths); the producers' bench, this
# tree and the checkout before (bb7b6b6); the eager 4K prefill (16 heads) and the GLA e2e, both checkouts.
#   run: bash tools/device_kernels.sh 570 device_stored_codes_job.sh   (carry scratch: the checkout before)
set -u
. tools/device_job_env.sh "$@"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 300 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/test_stored_codes.py \
  tests/test_fused_layer_ops.py tests/test_int8_gemm_kernel.py tests/test_gemm_decode.py tests/test_quantizing_rowwise.py \
  > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
for tag in "" _base; do
  path=$PYTHONPATH; [ "$tag" = _base ] && path="$BASE:$PYTHONPATH"
  PYTHONPATH="$path" timeout 150 python3 tools/bench_codes_producers.py --out "$W/codes$tag.json" \
    --label "${tag:-new}" > "$W/codes$tag.log" 2>&1
  log "codes bench$tag rc $?"
done
for tag in "" _base; do
  path=$PYTHONPATH; [ "$tag" = _base ] && path="$BASE:$PYTHONPATH"
  PYTHONPATH="$path" NUM_HEADS=16 VARIANTS="bf16 gla_int8_all" timeout 200 python3 tools/profile_prefill.py \
    "$W/prefill_h16$tag.json" 4096 > "$W/prefill_h16$tag.log" 2>&1
  log "prefill h16$tag rc $?"
done
bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
