#!/usr/bin/env bash
# MoE experts with int8 weights (2026-12-05): the GPU tests of the grouped kernels and of the MoE families calibrated
# with them, the kernels against transformers' bf16 grouped_mm / batched_mm on released models' layer shapes
# (tools/bench_moe_experts.py), then the e2e suite on two MoE hybrids with the experts int8 (hybrid_int8) and kept
# (--set experts.format=keep). Results under $1.
#   run: bash tools/device_kernels.sh 540 device_moe_experts_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -v -rfs --tb=short tests/test_moe_experts.py > "$W/gpu_tests_moe.log" 2>&1
log "moe tests rc $?"
timeout 300 python3 -m pytest -v -rfs --tb=short -m gpu -k "minimax or qwen3_5_moe or granitemoehybrid or kimi" \
  tests/test_hybrid.py tests/test_static_hybrid.py tests/test_graphed_step.py > "$W/gpu_tests_families.log" 2>&1
log "family gpu tests rc $?"
timeout 600 python3 tools/bench_moe_experts.py "$W/moe_experts.json" > "$W/moe_experts.log" 2>&1
log "bench rc $?"
# Qwen3-Next-style with its MoE (64 experts of 512, top-8, a shared expert), 1.6B; MiniMax as family_configs has it
QWEN_MOE='{"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 2,
 "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 64, "num_experts_per_tok": 8,
 "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1}'
QWEN_MOE=$(echo "$QWEN_MOE" | tr -d '\n')
E2E_TIMEOUT=240 hybrid_e2e qwen3_next _moe "$QWEN_MOE"
E2E_TIMEOUT=240 hybrid_e2e qwen3_next _moe_kept "$QWEN_MOE" --set experts.format=keep
E2E_TIMEOUT=200 hybrid_e2e minimax ""
E2E_TIMEOUT=200 hybrid_e2e minimax _kept "" --set experts.format=keep
touch "$W/job.done"
