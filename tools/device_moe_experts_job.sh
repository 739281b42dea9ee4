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
# every GPU test of the hybrids' model paths: the MoE families' now run int8 experts under hybrid_int8
timeout 480 python3 -m pytest -v -rfs --tb=short -m gpu tests/test_hybrid.py tests/test_static_hybrid.py \
  tests/test_graphed_step.py tests/test_generate.py > "$W/gpu_tests_families.log" 2>&1
log "family gpu tests rc $?"
timeout 600 python3 tools/bench_moe_experts.py "$W/moe_experts.json" > "$W/moe_experts.log" 2>&1
log "bench rc $?"
# Qwen3-Next-style with its MoE in every layer (32 experts of 512, top-4, a shared expert of 512), 2.3B parameters
# (1.6B of them experts); MiniMax as family_configs has it (4 experts of 1,408, top-2)
QWEN_MOE='{"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 2,
 "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 32, "num_experts_per_tok": 4,
 "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1}'
QWEN_MOE=$(echo "$QWEN_MOE" | tr -d '\n')
E2E_TIMEOUT=240 hybrid_e2e qwen3_next _moe "$QWEN_MOE"
E2E_TIMEOUT=240 hybrid_e2e qwen3_next _moe_kept "$QWEN_MOE" --set experts.format=keep
E2E_TIMEOUT=200 hybrid_e2e minimax ""
E2E_TIMEOUT=200 hybrid_e2e minimax _kept "" --set experts.format=keep
# the trained MoE hybrid (carry scratch/qwen3next-moe-small, made by tools/train.py --arch qwen3_next --size
# small_moe): its perplexity through the GPU kernels, against the CPU ablation in eval/results/moe_experts_cpu/
if [ -f scratch/qwen3next-moe-small/config.json ]; then
  timeout 600 python3 tools/ablation.py scratch/qwen3next-moe-small --device cuda --context 256 --samples 64 \
    --seq-len 256 --max-tokens 32768 --recipes hybrid_int8 hybrid_int8,experts.format=keep --quiet \
    --out "$W/ablation_moe_gpu" > "$W/ablation_moe_gpu.log" 2>&1
  log "ablation rc $?"
fi
touch "$W/job.done"
