#!/usr/bin/env bash
# The gated delta rule's split prefill (the chunk-parallel intra-chunk launch, a 32- or 64-token walk) against the
# one-launch walk and fla (tools/bench_split_intra.py; SPLIT_SHAPES / SPLIT_LAUNCHES narrow it), a hybrid's prefill with
# it on and off (scratch/e2e_split.py where carried), then the delta-rule kernel tests on the GPU and the mamba2 e2e.
#   run: bash tools/device_kernels.sh 540 device_split_intra_job.sh   (carry .whl for fla)
set -u
. tools/device_job_env.sh "$@"
export PYTHONPATH=$PYTHONPATH:$PWD/tools
[ -f scratch/debug_split.py ] && timeout 100 python3 scratch/debug_split.py > "$W/debug.jsonl" 2>&1
timeout 200 python3 tools/bench_split_intra.py ${SPLIT_SHAPES:+--shapes $SPLIT_SHAPES} \
  ${SPLIT_LAUNCHES:+--splits $SPLIT_LAUNCHES} > "$W/bench.jsonl" 2> "$W/bench.err"
log "bench rc $?"
[ -f scratch/e2e_split.py ] && timeout 150 python3 scratch/e2e_split.py > "$W/e2e_split.jsonl" 2> "$W/e2e_split.err"
log "e2e split rc $?"
timeout 150 python3 -m pytest -q tests/test_delta_kernels.py -p no:cacheprovider > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
timeout 200 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "mamba2:$(python3 tools/family_configs.py mamba2)" --out "$W/e2e_mamba2" > "$W/e2e_mamba2.log" 2>&1
log "mamba2 e2e rc $?"
touch "$W/job.done"
