#!/usr/bin/env bash
# KDA's intra-chunk kernel over channel slices: the KDA prefill GPU tests, then the chunk-size sweep vs fla.
#   run: bash tools/device_kernels.sh 300 device_kda_intra_job.sh   (carry .whl: fla is the peer)
set -u
. tools/device_job_env.sh "$@"
timeout 150 python3 -m pytest -q tests/test_kda_kernels.py -k "prefill or launch or formats or roundtrip or varlen or model_sized" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 150 python3 tools/bench_kda_prefill.py --block-t 16,32 > "$W/bench_kda_prefill.jsonl" 2> "$W/bench_kda_prefill.err"
log "bench rc $?"
touch "$W/job.done"
