#!/usr/bin/env bash
# Issue #14's host-bound eager paths after launch_kernel (kernels/common/launch.py) and the row-layout shortcut:
# one launch's host cost (tools/launch_cost.py); the eager decode steps and prefills of the 1.37B GLA
# (tools/profile_host.py without cProfile), this tree and the checkout before (scratch/base_pkg, first on PYTHONPATH)
# alternated twice;
# the GLA e2e (prefill and graphed decode, bf16 vs gla_int8_all); then the GPU tests of every kernel family whose
# launches moved to launch_kernel. Carry scratch.
#   run: bash tools/device_kernels.sh 570 device_fast_launch_job.sh
set -u
. tools/device_job_env.sh "$@"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 120 python3 tools/launch_cost.py "$W/launch_cost.json" > "$W/launch_cost.log" 2>&1
log "launch cost rc $?"
export CPROFILE=0 PREFILLS="1024 4096"
for rep in 1 2; do
  mkdir -p "$W/eager_new_$rep" "$W/eager_base_$rep"
  (cd tools && timeout 150 python3 profile_host.py "$W/eager_new_$rep") > "$W/eager_new_$rep.log" 2>&1
  log "eager new $rep rc $?"
  (cd tools && PYTHONPATH="$BASE:$PYTHONPATH" timeout 150 python3 profile_host.py "$W/eager_base_$rep") \
    > "$W/eager_base_$rep.log" 2>&1
  log "eager base $rep rc $?"
done
bash tools/device_gla_e2e.sh "$W"
timeout 420 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_launch.py tests/test_fused_layer_ops.py \
  tests/test_int8_gemm_kernel.py tests/test_decode_kernel.py tests/test_chunk_kernel.py tests/test_delta_kernels.py \
  tests/test_kda_kernels.py tests/test_short_conv.py tests/test_decode_attention.py tests/test_latent_attention.py \
  tests/test_store_kernel.py tests/test_ngram_draft.py tests/test_delta_gating.py tests/test_graphed_step.py \
  tests/test_verify.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
