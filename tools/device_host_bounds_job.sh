#!/usr/bin/env bash
# The prefill's host time, second step: the pieces' bounds made once per shape (kernels/gla/chunk.py) after the host-side
# launch arithmetic (kernels/common/sizes.py). Steps: the GPU tests of the chunk kernel, the graphed prefill and the
# prefix cache (a capture must not keep its bounds); the eager 4K prefill's wall and GPU time (tools/profile_prefill.py,
# alternating this tree and the checkout before, twice each); the 1.37B GLA e2e at B = 1 (its prefill row), both.
#   run: bash tools/device_kernels.sh 560 device_host_bounds_job.sh   (carry scratch: the checkout before, 02ae6d5)
set -u
. tools/device_job_env.sh "$@"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 300 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/test_chunk_kernel.py \
  tests/test_graphed_prefill.py tests/test_prefix_cache.py -k "gpu or segments or piece" > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
for rep in 1 2; do
  for tag in "" _base; do
    path=$PYTHONPATH; [ "$tag" = _base ] && path="$BASE:$PYTHONPATH"
    PYTHONPATH="$path" VARIANTS="bf16 gla_int8_all" timeout 300 python3 tools/profile_prefill.py \
      "$W/prefill$tag.$rep.json" 4096 > "$W/prefill$tag.$rep.log" 2>&1
    log "prefill$tag rep $rep rc $?"
  done
done
E2E_BATCHES=1 bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base E2E_BATCHES=1 bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
