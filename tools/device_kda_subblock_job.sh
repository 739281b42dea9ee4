#!/usr/bin/env bash
# KDA's intra-chunk kernel on sub-blocks: the launch sweep against the channel-slice kernel it replaces, the
# prefill bench against fla's chunk_kda (slow to autotune), GPU tests (KDA's prefill), the chunk-32 bench.
#   run: bash tools/device_kernels.sh 560 device_kda_subblock_job.sh   (carry .whl: fla is the peer, and scratch)
# scratch/kda_chunk_before.py, the kernel it replaced, is made on this machine first (not committed):
#   git show c7cd351:kernels/kda/chunk.py | sed -E 's/^( *)from \.\.(common|delta)/\1from laquant.kernels.\2/;
#     s/^from \.reference/from laquant.kernels.kda.reference/' > scratch/kda_chunk_before.py; touch scratch/__init__.py
set -u
. tools/device_job_env.sh "$@"
export PYTHONPATH=$PYTHONPATH:$PWD:$PWD/tools
timeout 110 python3 tools/sweep_kda_intra.py --shape 64x1024 --before scratch.kda_chunk_before > "$W/sweep_64x1024.jsonl" 2> "$W/sweep.err"
log "sweep rc $?"
timeout 180 python3 tools/bench_kda_prefill.py --shapes 64x1024,1x65536,1x1024 --block-t 16 > "$W/bench_fla.jsonl" 2> "$W/bench_fla.err"
log "bench fla rc $?"
timeout 150 python3 -m pytest -q tests/test_kda_kernels.py -k "prefill or intra or launch or formats or roundtrip or varlen or model_sized or strong" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 90 python3 tools/bench_kda_prefill.py --no-fla --shapes 64x1024,1x65536 --block-t 32 > "$W/bench_bt32.jsonl" 2> "$W/bench_bt32.err"
log "bench bt32 rc $?"
touch "$W/job.done"
