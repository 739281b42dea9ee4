#!/usr/bin/env bash
# Issue #14: the decode kernels loading before the PDL wait what the kernel before does not write: the GEMM's column
# scales / bias / outlier weights, the norms' weights, the low-rank gate's second linear and tail, GLA's output-norm
# weight, the decode kernels' slot and first block of state rows. Against the checkout before (scratch/base_pkg, carried), alternated:
# the split-K GEMM alone (8 and 0 outlier columns), the decode kernels alone (tools/decode_step_probe.py), the 1.37B
# GLA e2e (bf16 and gla_int8_all, B = 1 and 64), the qwen3_next hybrid's; then the GPU tests of the changed kernels.
#   run: bash tools/device_kernels.sh 540 device_param_prefetch_job.sh   (carry scratch/base_pkg)
set -u
. tools/device_job_env.sh "$@"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
for rep in 1 2; do
  for tag in _new _base; do
    path="$PYTHONPATH"; [ "$tag" = _base ] && path="$BASE:$PYTHONPATH"
    for no in 8 0; do
      PYTHONPATH="$path" timeout 120 python3 tools/vendor_gemm_probe.py --laquant-only --n-out $no --m 1,64 \
        --out "$W/gemm${tag}_o${no}_$rep" > "$W/gemm${tag}_o${no}_$rep.log" 2>&1
      log "gemm$tag o$no $rep rc $?"
    done
    PYTHONPATH="$path:tools:." timeout 100 python3 tools/decode_step_probe.py "$W/decode${tag}_$rep.json" \
      > "$W/decode${tag}_$rep.log" 2>&1
    log "decode probe$tag $rep rc $?"
    PYTHONPATH="$path" timeout 150 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 1024 \
      --gen 32 --no-profile --model "$CFG" --out "$W/e2e_gla${tag}_$rep" > "$W/e2e_gla${tag}_$rep.log" 2>&1
    log "e2e gla$tag $rep rc $?"
  done
done
for tag in _new _base; do E2E_TIMEOUT=200 hybrid_e2e qwen3_next "$tag"; done
timeout 280 python3 -m pytest -q -x tests/test_int8_gemm_kernel.py tests/test_gemm_decode.py tests/test_fused_layer_ops.py \
  tests/test_decode_kernel.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 200 python3 -m pytest -q tests/test_delta_kernels.py tests/test_kda_kernels.py -k decode \
  > "$W/gpu_tests_delta.log" 2>&1
log "gpu tests delta rc $?"
timeout 280 python3 -m pytest -q tests/test_gpu_model.py tests/test_graphed_step.py > "$W/gpu_tests_model.log" 2>&1
log "gpu tests model rc $?"
touch "$W/job.done"
