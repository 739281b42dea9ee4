#!/usr/bin/env bash
# Issue #14: where the graphed B = 64 decode step of the 1.37B GLA spends its wall clock (tools/graph_timeline.py:
# each instant of N replays split among the kernels running then), then the GPU tests not yet run on a GPU (the delta
# rule's bf16 64-token chunks, the intra kernels) and the mamba2 e2e.
#   run: bash tools/device_kernels.sh 560 device_timeline_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 tools/graph_timeline.py "$W/timeline.json" 24 ${TL_VARIANTS:-bf16,gla_int8_all} > "$W/timeline.log" 2>&1
log "timeline rc $?"
timeout 280 python3 -m pytest -q -x tests/test_delta_kernels.py tests/test_kda_kernels.py -p no:cacheprovider \
  -k "gpu or intra" > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
timeout 240 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "mamba2:$(python3 tools/family_configs.py mamba2)" --out "$W/e2e_mamba2" > "$W/e2e_mamba2.log" 2>&1
log "mamba2 e2e rc $?"
touch "$W/job.done"
