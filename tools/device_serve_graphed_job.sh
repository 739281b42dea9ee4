#!/usr/bin/env bash
# Issue #19: `laquant eval serve --draft ngram` after the fix (speculative rounds built without autograd): the GPU
# test of a round called with autograd on, and the serve replay with speculation (rounds graphed now?).
#   run: bash tools/device_kernels.sh 200 device_serve_graphed_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 90 python3 -m pytest -q -rfs --tb=short tests/test_speculative.py -m gpu -k autograd_on > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
bash tools/device_serve_ngram.sh "$W" 150
touch "$W/job.done"
