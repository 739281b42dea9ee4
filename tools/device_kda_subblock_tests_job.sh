#!/usr/bin/env bash
# KDA prefill GPU tests after the intra-chunk kernel moved to sub-blocks (the bench job's 150 s ran out): the kernel
# against its reference, model-sized heads in every state format, then the rest of the prefill tests.
#   run: bash tools/device_kernels.sh 470 device_kda_subblock_tests_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 440 python3 -m pytest -v -p no:cacheprovider tests/test_kda_kernels.py \
  -k "intra or model_sized_heads or strong or varlen or prefill_matches or launch or formats or roundtrip or pieces" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
