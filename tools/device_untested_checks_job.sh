#!/usr/bin/env bash
# transformers' generate on MoE hybrids with graph steps: the steps run grouped_mm where generate switched the
# experts to batched_mm and a step would copy more than 64 MB of a layer's experts (it gathered ~2.2 GB a layer at
# B = 64 on the 1.43B MiniMax-style model: 33 ms a step against laquant's graphed loop's 6 ms; at B = 1 batched_mm
# was the faster). GPU tests of the graph steps (bf16: grouped captured; fp32:
# batched_mm, grouped_mm refused), the diagnostic's replay times (tools/diag_hf_generate_steps.py, PROFILE=1), and the
# e2e of the MiniMax-style model (the hf_generate columns).
#   run: bash tools/device_kernels.sh 560 device_untested_checks_job.sh   (carry .whl; call again to poll)
set -u
. tools/device_job_env.sh "$@"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_graphed_step.py -k "gpu" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
FAMILY=minimax PROFILE=1 timeout 200 python3 tools/diag_hf_generate_steps.py "$W/hf_generate_steps_minimax.json" \
  > "$W/hf_generate_steps_minimax.log" 2>&1
log "hf generate steps minimax rc $?"
E2E_TIMEOUT=230 hybrid_e2e minimax ""
touch "$W/job.done"
