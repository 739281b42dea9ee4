#!/usr/bin/env bash
# One-token decode steps of laquant's GLA with fla softmax attn layers captured in the serving replay's greedy
# decode and in a draft's proposals: their GPU tests, and the replay's decode graphed against eager
# (tools/bench_replay_attn.py).
#   run: bash tools/device_kernels.sh 560 device_replay_attn_job.sh   (call again to poll)
set -u
. tools/device_job_env.sh "$@"
[ -n "${SKIP_TESTS:-}" ] || timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_prefix_cache.py tests/test_speculative.py \
  -k "gpu_hit_and_graphed or attn_layers_proposes" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 200 python3 tools/bench_replay_attn.py "$W/replay_attn.json" > "$W/replay_attn.log" 2>&1
log "bench rc $?"
touch "$W/job.done"
