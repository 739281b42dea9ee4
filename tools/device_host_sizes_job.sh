#!/usr/bin/env bash
# Host-side launch arithmetic as plain Python (kernels/common/sizes.py) and the GPU run of last session's untimed
# refactor (decode / latent attention's shared launch plumbing, the review fixes). Steps: the GPU tests of the
# attention kernels, the quantizing row-wise paths (Kimi / OLMo codes) and the fused layer ops; the eager 4K prefill's
# host profile (tools/profile_prefill.py, cProfile) and the 1.37B GLA e2e (B = 64), this tree and the checkout before
# (scratch/base_pkg, first on PYTHONPATH: *_base).   run: bash tools/device_kernels.sh 560 device_host_sizes_job.sh
set -u
. tools/device_job_env.sh "$@"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 420 python3 -m pytest -q -rfs --tb=short -m gpu -p no:cacheprovider tests/test_decode_attention.py \
  tests/test_latent_attention.py tests/test_mla_attention.py tests/test_quantizing_rowwise.py tests/test_sizes.py \
  tests/test_fused_layer_ops.py tests/test_static_hybrid.py > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
for tag in "" _base; do
  path=$PYTHONPATH; [ "$tag" = _base ] && path="$BASE:$PYTHONPATH"
  PYTHONPATH="$path" VARIANTS="bf16 gla_int8_all" CPROFILE=1 timeout 300 python3 tools/profile_prefill.py "$W/prefill_host$tag.json" 4096 \
    > "$W/prefill_host$tag.log" 2>&1
  log "prefill host$tag rc $?"
done
E2E_BATCHES=64 bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base E2E_BATCHES=64 bash tools/device_gla_e2e.sh "$W"
# the same profile once more, after the e2e runs, for the run-to-run spread of a host-bound wall clock
PYTHONPATH="$PYTHONPATH" VARIANTS="bf16 gla_int8_all" timeout 300 python3 tools/profile_prefill.py "$W/prefill_host_again.json" 4096 \
  > "$W/prefill_host_again.log" 2>&1
PYTHONPATH="$BASE:$PYTHONPATH" VARIANTS="bf16 gla_int8_all" timeout 300 python3 tools/profile_prefill.py "$W/prefill_host_again_base.json" 4096 \
  > "$W/prefill_host_again_base.log" 2>&1
log "prefill again rc $?"
touch "$W/job.done"
