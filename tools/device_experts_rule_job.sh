#!/usr/bin/env bash
# laquant's own decode loop on MoE hybrids runs its decode steps' experts as laquant.moe_experts' rule picks
# (batched_mm up to 64 MB gathered a layer, else grouped_mm): the GPU tests of the rule (laquant's loop and
# transformers' generate's graph steps), the three choices timed by batch (tools/bench_experts_impl.py), and the e2e
# speed suite before (scratch/base_pkg) and after, MiniMax and Kimi Linear.
#   run: bash tools/device_kernels.sh 560 device_experts_rule_job.sh   (call again to poll)
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_static_hybrid.py tests/test_graphed_step.py \
  -k "gpu and (experts or moe or replays or equals_the_eager)" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
for fam in minimax kimi_linear; do
  FAMILY=$fam timeout 200 python3 tools/bench_experts_impl.py "$W/experts_$fam.json" > "$W/experts_$fam.log" 2>&1
  log "experts $fam rc $?"
  hybrid_e2e $fam _base
  hybrid_e2e $fam ""
done
touch "$W/job.done"
