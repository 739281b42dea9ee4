#!/usr/bin/env bash
# The gated delta rule's split prefill (the chunk-parallel intra-chunk launch, a 32- or 64-token walk) against the
# one-launch walk and fla (tools/bench_split_intra.py; SPLIT_SHAPES / SPLIT_LAUNCHES narrow it), KDA's prefill at each
# chunk size (its intra-chunk kernel shares the triangular inverse), then the delta-rule and KDA kernel tests on the GPU.
#   run: bash tools/device_kernels.sh 540 device_split_intra_job.sh   (carry .whl for fla)
set -u
. tools/device_job_env.sh "$@"
export PYTHONPATH=$PYTHONPATH:$PWD/tools
[ -f scratch/debug_split.py ] && timeout 120 python3 scratch/debug_split.py > "$W/debug.jsonl" 2>&1
timeout 300 python3 tools/bench_split_intra.py ${SPLIT_SHAPES:+--shapes $SPLIT_SHAPES} \
  ${SPLIT_LAUNCHES:+--splits $SPLIT_LAUNCHES} > "$W/bench.jsonl" 2> "$W/bench.err"
log "bench rc $?"
timeout 120 python3 tools/bench_kda_prefill.py --no-fla --shapes 1x65536,64x1024 > "$W/kda.jsonl" 2> "$W/kda.err"
log "kda rc $?"
timeout 240 python3 -m pytest -q tests/test_delta_kernels.py tests/test_kda_kernels.py -p no:cacheprovider \
  > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
touch "$W/job.done"
