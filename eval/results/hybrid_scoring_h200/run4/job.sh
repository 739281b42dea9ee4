#!/usr/bin/env bash
# Issue #14, what the 2026-12-03 sessions left unrun on the GPU, most needed first (the whole job can outrun one
# session's device time; each step logs its end in status.log):
#  0. what a decode GEMM pays to quantize its own input per 128-column group (tools/probe_group_quant_gemm.py: the
#     way to fewer kernels a layer, eval/results/b64_step_budget.md; first, as it decides the next work);
#  1. every transformers hybrid family's scoring replay against its eager forward, bit for bit
#     (tests/test_graphed_forward.py: eval ppl's prefill mode replays them by default);
#  2. gla_int8_all's perplexity on gla-small through the kernels against the CPU reference on the same tokens (the
#     issue's "< 0.05%"; the last such check predates most of the fusions);
#  3. ~1B configs of three hybrid families through tools/bench_hybrid_scoring.py (their captures check themselves);
#  4. the 64-token chunk tests not reached (KDA at K = V = 128, the delta rule's).
#   run: bash tools/device_kernels.sh 560 device_hybrid_replay_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 480 python3 tools/probe_group_quant_gemm.py --out "$W/group_quant_gemm" > "$W/group_quant_gemm.log" 2>&1
log "group quant gemm probe rc $?"
timeout 400 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider tests/test_graphed_forward.py -m gpu -k hybrid \
  > "$W/gpu_tests_hybrid.log" 2>&1
log "hybrid gpu tests rc $?"
for dev in cuda cpu; do
  timeout 400 python3 tools/ablation.py --device $dev --max-tokens 16384 --quiet --recipes gla_int8_all \
    --out "$W/ablation_gla-small_$dev" > "$W/ablation_$dev.log" 2>&1
  log "ablation $dev rc $?"
done
models=("qwen3_next:{}")
for fam in nemotron_h kimi_linear; do models+=("$fam:$(python3 tools/family_configs.py "$fam")"); done
timeout 600 python3 tools/bench_hybrid_scoring.py --out "$W/hybrid_scoring" --model "${models[@]}" \
  > "$W/hybrid_scoring.log" 2>&1
log "hybrid scoring bench rc $?"
timeout 500 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider -m gpu \
  "tests/test_kda_kernels.py::test_64_token_chunks_on_gpu" "tests/test_delta_kernels.py::test_64_token_chunks_on_gpu" \
  -k "128-128 or test_delta" > "$W/gpu_tests_chunk64.log" 2>&1
log "chunk64 gpu tests rc $?"
touch "$W/job.done"
