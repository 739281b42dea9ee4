#!/usr/bin/env bash
# Issue #14: the cacheless forward replayed as a CUDA graph (laquant.serving.graphed_forward) on the GPU: its tests,
# the moved-model decode test and the graphed prefill's, then eager against replayed scoring calls (model(ids),
# an lm-eval-like request stream, eval ppl's prefill mode) for bf16 and gla_int8_all on the 1.37B GLA; first, the
# 64-token chunk probe of the delta-rule / KDA prefills (tools/probe_chunk64.py).
#   run: bash tools/device_kernels.sh 560 device_graphed_forward_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 tools/probe_chunk64.py > "$W/probe_chunk64.txt" 2>&1
log "probe rc $?"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_graphed_forward.py tests/test_graphed_prefill.py \
  tests/test_generate.py::test_a_moved_model_is_captured_again -m gpu > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 480 python3 tools/bench_graphed_forward.py --out "$W/bench" > "$W/bench.log" 2>&1
log "bench rc $?"
touch "$W/job.done"
