#!/usr/bin/env bash
# The gated delta rule's split prefill (the chunk-parallel intra-chunk launch, a 64-token walk) against the one-launch
# walk and fla (tools/bench_split_intra.py), then the delta-rule and KDA kernel tests on the GPU.
#   run: bash tools/device_kernels.sh 540 device_split_intra_job.sh   (carry .whl for fla)
set -u
. tools/device_job_env.sh "$@"
export PYTHONPATH=$PYTHONPATH:$PWD/tools
timeout 330 python3 tools/bench_split_intra.py ${SPLIT_SHAPES:+--shapes $SPLIT_SHAPES} > "$W/bench.jsonl" 2> "$W/bench.err"
log "bench rc $?"
timeout 240 python3 -m pytest -q -x tests/test_delta_kernels.py tests/test_kda_kernels.py -p no:cacheprovider \
  > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
touch "$W/job.done"
