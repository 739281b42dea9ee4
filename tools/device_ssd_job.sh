#!/usr/bin/env bash
# Mamba2's decode step in one kernel (the GLA decode kernel's SSD mode): its GPU tests (the kernel against its
# reference; the models' state paths and graphed decoding on the GPU), then the 1.15B nemotron_h e2e (bf16 vs
# hybrid_int8; before: eval/results/families_h200/run2_outlier_limit/).
#   run: bash tools/device_kernels.sh 170 device_ssd_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 90 python3 -m pytest -q -rfs --tb=short tests/test_decode_kernel.py \
  tests/test_hybrid.py::test_hybrid_state_paths_on_the_triton_kernels tests/test_static_hybrid.py \
  -k "ssd or mamba2 or bamba or nemotron" \
  > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
FAMILIES_TO_RUN=nemotron_h bash tools/device_families_job.sh "$W"
