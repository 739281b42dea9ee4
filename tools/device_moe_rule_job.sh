#!/usr/bin/env bash
# The int8 experts' tile rule as fitted to the sweep of device_moe_tiles_job.sh (2026-12-05, third run): the MoE e2e
# on the 2.3B Qwen3-Next-style model and on MiniMax, nothing else (the lease had ~5 min left). Results under $1.
#   run: bash tools/device_kernels.sh 240 device_moe_rule_job.sh
set -u
. tools/device_job_env.sh "$@"
QWEN_MOE='{"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 2,
 "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 32, "num_experts_per_tok": 4,
 "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1}'
QWEN_MOE=$(echo "$QWEN_MOE" | tr -d '\n')
E2E_TIMEOUT=150 hybrid_e2e qwen3_next _moe "$QWEN_MOE"
E2E_TIMEOUT=120 hybrid_e2e minimax ""
touch "$W/job.done"
