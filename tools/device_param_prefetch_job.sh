#!/usr/bin/env bash
# Issue #14: the decode kernels loading before the PDL wait what the kernel before does not write: the GEMM's column
# scales / bias / outlier weights, the norms' weights, the low-rank gate's second linear and tail, GLA's output-norm
# weight ("mid": d5d87dc, carried as scratch/mid_pkg), then also the decode kernels' slot and first block of state
# rows (this tree, "new"). Against the checkout before (scratch/base_pkg, carried): the split-K GEMM alone (8 outlier
# columns), the 1.37B GLA e2e (bf16 and gla_int8_all, B = 1
# and 64; new, base, base, new), GPU tests of the changed kernels, the Kimi Linear hybrid's e2e (KDA), the mid build's, model GPU tests.
#   run: bash tools/device_kernels.sh 540 device_param_prefetch_job.sh   (carry scratch/base_pkg scratch/mid_pkg)
set -u
. tools/device_job_env.sh "$@"
MID="$PWD/scratch/mid_pkg"
for d in "$BASE" "$MID"; do [ -d "$d/laquant/assets" ] || cp -r laquant/assets "$d/laquant/assets"; done
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
pathof() { case $1 in _base) echo "$BASE:$PYTHONPATH" ;; _mid) echo "$MID:$PYTHONPATH" ;; *) echo "$PYTHONPATH" ;; esac; }
for tag in _new _base; do
  PYTHONPATH="$(pathof $tag)" timeout 120 python3 tools/vendor_gemm_probe.py --laquant-only --n-out 8 --m 1,64 \
    --out "$W/gemm$tag" > "$W/gemm$tag.log" 2>&1
  log "gemm$tag rc $?"
done
rep=0
for tag in _new _base _base _new; do
  rep=$((rep + 1))
  PYTHONPATH="$(pathof $tag)" timeout 150 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 \
    --prompt 1024 --gen 32 --no-profile --model "$CFG" --out "$W/e2e_gla${tag}_$rep" > "$W/e2e_gla${tag}_$rep.log" 2>&1
  log "e2e gla$tag $rep rc $?"
done
timeout 150 python3 -m pytest -q tests/test_decode_kernel.py > "$W/gpu_tests_gla_decode.log" 2>&1
log "gpu tests gla decode rc $?"
timeout 150 python3 -m pytest -q tests/test_delta_kernels.py tests/test_kda_kernels.py -k decode \
  > "$W/gpu_tests_delta.log" 2>&1
log "gpu tests delta rc $?"
timeout 200 python3 -m pytest -q tests/test_int8_gemm_kernel.py tests/test_gemm_decode.py tests/test_fused_layer_ops.py \
  > "$W/gpu_tests_gemm_rowwise.log" 2>&1
log "gpu tests gemm rowwise rc $?"
for tag in _new _base; do E2E_TIMEOUT=200 hybrid_e2e kimi_linear "$tag"; done  # KDA: the delta-rule decode kernel
PYTHONPATH="$MID:$PYTHONPATH" timeout 150 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 \
  --prompt 1024 --gen 32 --no-profile --model "$CFG" --out "$W/e2e_gla_mid_5" > "$W/e2e_gla_mid_5.log" 2>&1
log "e2e gla_mid 5 rc $?"
timeout 280 python3 -m pytest -q tests/test_gpu_model.py tests/test_graphed_step.py > "$W/gpu_tests_model.log" 2>&1
log "gpu tests model rc $?"
touch "$W/job.done"
