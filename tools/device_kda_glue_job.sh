#!/usr/bin/env bash
# Kimi Linear's KDA layer glue as laquant kernels (issue #14): the sigmoid-gated output norm writing o_proj's codes,
# the forget gate's tail in one launch, q / k / v read by the conv where the GEMM wrote them. GPU tests, then the
# e2e of Kimi Linear and OLMo hybrid (its q / k / v too) against the checkout before (scratch/base_pkg, first on
# PYTHONPATH) in the same job, and Kimi Linear's graphed B = 64 step kernel by kernel.
#   run: bash tools/device_kernels.sh 560 device_kda_glue_job.sh   (carry .whl and scratch)
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_fused_layer_ops.py tests/test_delta_gating.py \
  tests/test_quantizing_rowwise.py tests/test_static_hybrid.py \
  -k "sigmoid or gated or gating or kda or (gpu and kimi) or (graphed and kimi)" > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
for fam in kimi_linear olmo_hybrid; do
  hybrid_e2e "$fam" ""
  hybrid_e2e "$fam" _base
done
timeout 200 python3 tools/graph_timeline.py "$W/timeline_kimi_linear.json" --prompt 1024 \
  --model "kimi_linear:$(python3 tools/family_configs.py kimi_linear)" > "$W/timeline_kimi_linear.log" 2>&1
log "kimi timeline rc $?"
touch "$W/job.done"
