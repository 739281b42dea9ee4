#!/usr/bin/env bash
# Issue #14: the fused norms' and SwiGLU's W8A8 codes written from registers (triton_numerics.store_tile_codes)
# instead of read back from the stored output. Steps: the codes kernels' GPU tests (codes bit-equal to
# quantize_rows') and the hybrids' codes path on the GPU; the hybrid e2e; the 1.37B GLA's e2e (gla_int8_all).
# Results under $1, one status line a step.   run: bash tools/device_kernels.sh 300 device_codes_epilogue_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 -m pytest -q -rfs --tb=short tests/test_fused_layer_ops.py > "$W/gpu_tests_codes.log" 2>&1
log "codes kernel tests rc $?"
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
timeout 300 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "qwen3_next:$CONFIG" --out "$W/e2e_hybrid" > "$W/e2e_hybrid.log" 2>&1
log "hybrid e2e rc $?"
timeout 300 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 4096 --gen 32 \
  --model 'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}' \
  --out "$W/e2e_gla" > "$W/e2e_gla.log" 2>&1
log "gla e2e rc $?"
timeout 200 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_quantizing_rowwise.py tests/test_gpu_model.py \
  > "$W/gpu_tests_paths.log" 2>&1
log "codes path gpu tests rc $?"
touch "$W/job.done"
