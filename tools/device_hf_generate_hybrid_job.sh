#!/usr/bin/env bash
# transformers' generate with graph steps on the hybrids: the GPU tests, then the 1.14B qwen3_next e2e (its
# hf_generate_B* columns; with LAQUANT_GRAPH_STEPS=0 as e2e_hybrid_nographs). Results under $1.
set -u
. tools/device_job_env.sh "$@"
timeout 400 python3 -m pytest -v -rfs --tb=short -m gpu tests/test_graphed_step.py tests/test_static_hybrid.py \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
timeout 400 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "qwen3_next:$CONFIG" --out "$W/e2e_hybrid" > "$W/e2e_hybrid.log" 2>&1
log "hybrid e2e rc $?"
LAQUANT_GRAPH_STEPS=0 timeout 400 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 \
  --gen 32 --model "qwen3_next:$CONFIG" --out "$W/e2e_hybrid_nographs" > "$W/e2e_hybrid_nographs.log" 2>&1
log "hybrid e2e nographs rc $?"
touch "$W/job.done"
