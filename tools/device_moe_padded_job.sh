#!/usr/bin/env bash
# The int8 MoE experts' and the padded batches' first GPU run (2026-12-05, eval/results/moe_experts_h200/ run 1 and
# padded_generate_h200/), correctness first: the GPU tests of the grouped experts kernels and of the padded-batch
# paths, the experts' kernel bench, the MoE e2e with the experts int8 and kept, every hybrid GPU test, then the
# padded-generate bench. Results under $1.
#   run: bash tools/device_kernels.sh 540 device_moe_padded_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -v -rfs --tb=short tests/test_moe_experts.py > "$W/gpu_tests_moe.log" 2>&1
log "moe tests rc $?"
timeout 200 python3 -m pytest -v -rfs --tb=short -m gpu -k "padded or padding" tests/test_graphed_step.py \
  tests/test_generate.py > "$W/gpu_tests_padded.log" 2>&1
log "padded tests rc $?"
timeout 300 python3 tools/bench_moe_experts.py "$W/moe_experts.json" > "$W/moe_experts.log" 2>&1
log "bench rc $?"
QWEN_MOE=$(python3 tools/family_configs.py qwen3_next --moe)
E2E_TIMEOUT=220 hybrid_e2e qwen3_next _moe "$QWEN_MOE"
E2E_TIMEOUT=220 hybrid_e2e qwen3_next _moe_kept "$QWEN_MOE" --set experts.format=keep
timeout 420 python3 -m pytest -v -rfs --tb=short -m gpu tests/test_hybrid.py tests/test_static_hybrid.py \
  tests/test_graphed_step.py tests/test_generate.py > "$W/gpu_tests_families.log" 2>&1
log "family gpu tests rc $?"
E2E_TIMEOUT=160 hybrid_e2e minimax ""
E2E_TIMEOUT=160 hybrid_e2e minimax _kept "" --set experts.format=keep
GLA='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
QWEN="qwen3_next:$(python3 tools/family_configs.py qwen3_next)"
timeout 420 python3 tools/bench_padded_generate.py "$W/padded_generate.json" "$GLA" "$QWEN" \
  > "$W/padded_generate.log" 2>&1
log "padded bench rc $?"
touch "$W/job.done"
