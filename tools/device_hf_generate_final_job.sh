#!/usr/bin/env bash
# The final code's e2e with graph steps: the 1.14B qwen3_next and the 1.37B GLA (hf_generate_B* columns, peak memory).
set -u
. tools/device_job_env.sh "$@"
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
timeout 300 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "qwen3_next:$CONFIG" --out "$W/e2e_hybrid" > "$W/e2e_hybrid.log" 2>&1
log "hybrid e2e rc $?"
timeout 300 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 4096 --gen 32 \
  --model 'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}' \
  --out "$W/e2e_gla" > "$W/e2e_gla.log" 2>&1
log "gla e2e rc $?"
touch "$W/job.done"
