#!/usr/bin/env bash
# The hybrid capture probe (tools/probe_hybrid_capture.py, with the bench's qwen3_next), then, with laquant's captures
# building transformers' eager masks, the hybrids' GPU replay tests and tools/bench_hybrid_scoring.py.
#   run: bash tools/device_kernels.sh 300 device_probe_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 150 python3 tools/probe_hybrid_capture.py --families qwen3_next qwen3_next_dense qwen3_next_bench \
  > "$W/probe_hybrid_capture.txt" 2>&1
log "probe rc $?"
timeout 120 python3 -m pytest -q -rfs --tb=short tests/test_graphed_forward.py -m gpu -k hybrid \
  > "$W/gpu_tests_hybrid.log" 2>&1
log "hybrid gpu tests rc $?"
timeout 200 python3 tools/bench_hybrid_scoring.py --out "$W/hybrid_scoring" > "$W/hybrid_scoring.log" 2>&1
log "hybrid scoring bench rc $?"
touch "$W/job.done"
