#!/usr/bin/env bash
# Both unrun device jobs of 2026-12-04/05 in one lease, correctness first: the GPU tests of the int8 grouped experts
# and of the padded-batch paths, then the experts' kernel bench, the MoE e2e (experts int8 against kept), the trained
# MoE's perplexity through the GPU kernels, every hybrid GPU test, then the padded-generate bench. Results under $1.
#   run: bash tools/device_kernels.sh 540 device_moe_padded_job.sh   (each call: `mkdir -p /tmp/moe_parts &&
#   cp .moeparts/moeN/* /tmp/moe_parts/ && ...` carrying .moeparts/moeN, N = 1 ... 6; poll until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -v -rfs --tb=short tests/test_moe_experts.py > "$W/gpu_tests_moe.log" 2>&1
log "moe tests rc $?"
timeout 200 python3 -m pytest -v -rfs --tb=short -m gpu -k "padded or padding" tests/test_graphed_step.py \
  tests/test_generate.py > "$W/gpu_tests_padded.log" 2>&1
log "padded tests rc $?"
timeout 300 python3 tools/bench_moe_experts.py "$W/moe_experts.json" > "$W/moe_experts.log" 2>&1
log "bench rc $?"
QWEN_MOE='{"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 2,
 "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 32, "num_experts_per_tok": 4,
 "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1}'
QWEN_MOE=$(echo "$QWEN_MOE" | tr -d '\n')
E2E_TIMEOUT=220 hybrid_e2e qwen3_next _moe "$QWEN_MOE"
E2E_TIMEOUT=220 hybrid_e2e qwen3_next _moe_kept "$QWEN_MOE" --set experts.format=keep
# the trained model is over one call's carry beside the tree (58 MB of 64), so it is optional: six calls each copy a sixth into /tmp/moe_parts
# (.moeparts/moe1: configs, tokenizer and model.safetensors' first sixth, as split -n 6 -d names it; moe2-6: the rest)
M=/tmp/qwen3next-moe-small
for i in $(seq 12); do [ ! -d /tmp/moe_parts ] || [ -f /tmp/moe_parts/moe_w.05 ] && break; sleep 10; done
if [ -f /tmp/moe_parts/moe_w.05 ] && [ -f /tmp/moe_parts/config.json ]; then
  mkdir -p $M && cp /tmp/moe_parts/*.json $M/ && cat /tmp/moe_parts/moe_w.0[0-5] > $M/model.safetensors
  timeout 300 python3 tools/ablation.py $M --device cuda --context 256 --samples 64 \
    --seq-len 256 --max-tokens 32768 --recipes hybrid_int8 hybrid_int8,experts.format=keep --quiet \
    --out "$W/ablation_moe_gpu" > "$W/ablation_moe_gpu.log" 2>&1
  log "ablation rc $?"
fi
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
