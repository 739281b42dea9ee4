#!/usr/bin/env bash
# The delta rule's one-chunk verify (numerics "prefill") with a per-head decay applied to the [T, T] scores after
# their products (as the chunked prefill's D tile) instead of per channel inside them, timed against the checkout
# before (scratch/base_pkg) and a variant whose unit-triangle inverse takes single TF32 products; the GPU tests of
# the verify kernels; and laquant's graphed decode loop on a MoE hybrid with grouped_mm against batched_mm experts.
#   run: bash tools/device_kernels.sh 560 device_verify_scalar_job.sh   (call again to poll)
set -u
. tools/device_job_env.sh "$@"
VAR=/tmp/var_pkg
rm -rf $VAR && mkdir -p $VAR && cp -r laquant $VAR/ && cp -r kernels recipes $VAR/laquant/
sed -i 's/dot_f32(power, power, True)/tl.dot(power, power, input_precision="tf32")/; s/dot_f32(X, eye + power, True)/tl.dot(X, eye + power, input_precision="tf32")/' \
  $VAR/laquant/kernels/common/triton_numerics.py
grep -c 'input_precision="tf32")' $VAR/laquant/kernels/common/triton_numerics.py > "$W/variant_check.txt"
cd tools
for tag in base new tf32; do
  case $tag in base) p=$BASE ;; new) p= ;; tf32) p=$VAR ;; esac
  PYTHONPATH="$p${p:+:}$PYTHONPATH" timeout 200 python3 exp_verify_chunk.py "$W/e2e_shapes_$tag.json" \
    > "$W/e2e_shapes_$tag.log" 2>&1
  log "exp $tag rc $?"
done
cd ..
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_verify.py -k "prefill or chunk" > "$W/gpu_tests_verify.log" 2>&1
log "gpu tests rc $?"
FAMILY=minimax timeout 170 python3 tools/bench_experts_impl.py "$W/experts_minimax.json" > "$W/experts_minimax.log" 2>&1
log "experts rc $?"
touch "$W/job.done"
