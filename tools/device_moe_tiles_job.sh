#!/usr/bin/env bash
# The int8 experts' one-launch alignment and tile rule (2026-12-05, second run): their GPU tests, the MoE e2e on the
# 2.3B Qwen3-Next-style model and MiniMax (against eval/results/moe_experts_h200/, the ~20-launch alignment and
# fixed tiles), then the kernel bench with the tile sweep. Results under $1.
#   run: bash tools/device_kernels.sh 540 device_moe_tiles_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 -m pytest -v -rfs --tb=short tests/test_moe_experts.py > "$W/gpu_tests_moe.log" 2>&1
log "moe tests rc $?"
QWEN_MOE='{"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 2,
 "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 32, "num_experts_per_tok": 4,
 "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1}'
QWEN_MOE=$(echo "$QWEN_MOE" | tr -d '\n')
E2E_TIMEOUT=220 hybrid_e2e qwen3_next _moe "$QWEN_MOE"
E2E_TIMEOUT=160 hybrid_e2e minimax ""
timeout 420 python3 tools/bench_moe_experts.py "$W/moe_experts.json" --sweep > "$W/moe_experts.log" 2>&1
log "bench rc $?"
touch "$W/job.done"
