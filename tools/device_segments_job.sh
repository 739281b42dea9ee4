#!/usr/bin/env bash
# The delta rule's and KDA's prefill walked as sequence-parallel pieces (segments): GPU tests, then the bench against
# one walk and fla (slow to autotune) on long single sequences and batched shapes.
#   run: bash tools/device_kernels.sh 540 device_segments_job.sh   (carry .whl: fla is the peer)
set -u
. tools/device_job_env.sh "$@"
export PYTHONPATH=$PYTHONPATH:$PWD/tools
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_delta_kernels.py tests/test_kda_kernels.py \
  -k "segment or model_sized_heads or prefill_matches or pieces or varlen" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 280 python3 tools/bench_segmented_prefill.py --shapes 1x1024,1x4096,1x16384,1x65536,4x16384,64x1024 \
  > "$W/bench.jsonl" 2> "$W/bench.err"
log "bench rc $?"
touch "$W/job.done"
