#!/usr/bin/env bash
# Issue #19: `laquant eval serve --draft ngram` after the fix (speculative rounds built without autograd): the GPU
# test of a round called with autograd on, and the serve replay with speculation (rounds graphed now?).
#   run: bash tools/device_kernels.sh 200 device_serve_graphed_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 90 python3 -m pytest -q -rfs --tb=short tests/test_speculative.py -m gpu -k autograd_on > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
timeout 150 python3 -m laquant.cli eval serve --recipe gla_int8 --system 4096 --user 64 --reply 32 --conversations 4 \
  --turns 3 --block-size 256 --reps 5 --device cuda --no-accuracy --draft ngram --draft-tokens 8 --quiet \
  --out "$W/serve_ngram" > "$W/serve_ngram.log" 2>&1
log "serve ngram rc $?"
touch "$W/job.done"
