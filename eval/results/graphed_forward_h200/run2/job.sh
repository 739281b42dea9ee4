#!/usr/bin/env bash
# Issue #14: the cacheless forward replayed as a CUDA graph (laquant.serving.graphed_forward) on the GPU: the 64-token
# chunk probe of the float32 delta rule at 4 warps (tools/probe_chunk64.py), the float32 GPU tests of both prefills at
# 64-token chunks (chunk_warps' 2 warps at K <= 32), the graphed forward's GPU tests, then eager against replayed scoring calls (model(ids), an
# lm-eval-like request stream, eval ppl's prefill mode) for bf16 and gla_int8_all on the 1.37B GLA.
#   run: bash tools/device_kernels.sh 560 device_graphed_forward_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 120 python3 tools/probe_chunk64.py delta:fp32:16:32:4 > "$W/probe_chunk64.txt" 2>&1
log "probe rc $?"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_graphed_forward.py tests/test_kda_kernels.py \
  tests/test_delta_kernels.py -m gpu -k "replay or (64_token and dtype0)" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 480 python3 tools/bench_graphed_forward.py --hybrid "qwen3_next:{}" --out "$W/bench" > "$W/bench.log" 2>&1
log "bench rc $?"
touch "$W/job.done"
