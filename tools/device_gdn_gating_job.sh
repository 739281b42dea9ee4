#!/usr/bin/env bash
# Issue #14: the gated delta rule's gate tail as one kernel (kernels/delta/gating.py): its tests and GLA's gate tail
# (refactored onto the shared fake_quantize_int8) on the GPU, the hybrids' GPU tests (rowwise codes path, static
# cache and graph capture), then the 1.14B qwen3_next's e2e and its B = 64 step's and prefill's profile.
# Run by `bash tools/device_kernels.sh WAIT device_gdn_gating_job.sh`. $1: work folder.
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 -m pytest -q -rfs --tb=short tests/test_delta_gating.py tests/test_fused_layer_ops.py \
  > "$W/gpu_tests_gating.log" 2>&1
log "gating tests rc $?"
bash tools/device_hybrid_e2e.sh "$W"
timeout 300 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_quantizing_rowwise.py tests/test_static_hybrid.py \
  > "$W/gpu_tests_hybrid.log" 2>&1
log "hybrid gpu tests rc $?"
touch "$W/job.done"
