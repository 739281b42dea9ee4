#!/usr/bin/env bash
# The prefill sizes' codes path (kernels/rowwise/fused.py: several tokens a program, SwiGLU in column blocks). Steps: GPU
# tests of the row-wise kernels and of the quantizing row-wise paths, and of the decode / latent attention kernels after
# their shared online-softmax step (b9d8ed0, never run on a GPU); the codes producers' launch sweep against the
# one-token-a-program path; the eager 4K prefill (tools/profile_prefill.py, 16 and 4 heads), this tree and the checkout
# before alternating.
#   run: bash tools/device_kernels.sh 560 device_tiled_codes_job.sh   (carry scratch: the checkout before, bb7b6b6)
set -u
. tools/device_job_env.sh "$@"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 420 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/test_fused_layer_ops.py \
  tests/test_quantizing_rowwise.py > "$W/gpu_tests_rowwise.log" 2>&1
log "rowwise tests rc $?"
timeout 300 python3 -m pytest -q -rfs --tb=short -m gpu -p no:cacheprovider tests/test_decode_attention.py \
  tests/test_latent_attention.py tests/test_mla_attention.py tests/test_static_hybrid.py > "$W/gpu_tests_attention.log" 2>&1
log "attention tests rc $?"
timeout 400 python3 tools/bench_codes_producers.py --sweep-tiled --out "$W/codes_tiled.json" > "$W/codes_tiled.log" 2>&1
log "sweep rc $?"
for heads in 16 4; do
  for tag in "" _base; do
    path=$PYTHONPATH; [ "$tag" = _base ] && path="$BASE:$PYTHONPATH"
    PYTHONPATH="$path" NUM_HEADS=$heads VARIANTS="bf16 gla_int8_all" timeout 300 python3 tools/profile_prefill.py \
      "$W/prefill_h$heads$tag.json" 4096 > "$W/prefill_h$heads$tag.log" 2>&1
    log "prefill h$heads$tag rc $?"
  done
done
touch "$W/job.done"
