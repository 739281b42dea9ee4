#!/usr/bin/env bash
# Issue #14, what the 2026-12-03 session left unrun on the GPU: a padded replay's scores against the eager forward's on
# the trained gla-small (tools/padded_replay_accuracy.py: decides whether padded replays can be lm-eval's default),
# why a transformers hybrid's captured forward differed from its eager one (tools/probe_hybrid_capture.py) and, with
# the check answered in captures, the hybrids' replays (GPU tests, tools/bench_hybrid_scoring.py), the
# 64-token chunk tests that did not run (KDA in bf16 and at K = V = 128, the delta rule in float32), and the graphed
# prefill's and forward's GPU tests.
#   run: bash tools/device_kernels.sh 560 device_scoring_checks_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 tools/probe_hybrid_capture.py > "$W/probe_hybrid_capture.txt" 2>&1
log "hybrid capture probe rc $?"
timeout 300 python3 -m pytest -q -rfs --tb=short tests/test_graphed_forward.py -m gpu -k hybrid \
  > "$W/gpu_tests_hybrid.log" 2>&1
log "hybrid gpu tests rc $?"
timeout 300 python3 tools/bench_hybrid_scoring.py --out "$W/hybrid_scoring" > "$W/hybrid_scoring.log" 2>&1
log "hybrid scoring bench rc $?"
timeout 240 python3 tools/padded_replay_accuracy.py > "$W/padded_replay_accuracy.txt" 2>&1
log "padded accuracy rc $?"
timeout 420 python3 -m pytest -q -rfs --tb=short tests/test_kda_kernels.py tests/test_delta_kernels.py \
  tests/test_graphed_forward.py tests/test_graphed_prefill.py -m gpu -k "64_token or replay or graph" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
