#!/usr/bin/env bash
# transformers' generate on laquant's GLA with fla softmax attn layers now takes graph steps (their keys in static
# buffers): its GPU test, and the tokens/s of a 1.37B GLA with two attn layers with graph steps on and off
# (tools/bench_hf_generate_attn.py).
#   run: bash tools/device_kernels.sh 560 device_untested_checks_job.sh   (call again to poll)
set -u
. tools/device_job_env.sh "$@"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_graphed_step.py -k "gpu and attn" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 150 python3 tools/bench_hf_generate_attn.py "$W/hf_generate_attn.json" > "$W/hf_generate_attn.log" 2>&1
log "bench rc $?"
touch "$W/job.done"
