#!/usr/bin/env bash
# Issue #14: per-group W8A8 (act_granularity per_group, one activation scale per token and 128 input columns), the
# numerics of the route in eval/results/b64_step_budget.md, on the GPU (each step logs its end in status.log):
#  1. the GPU tests of the per-group GEMM and producers (the norms' and SwiGLU's per-group codes) and of the kernels
#     they share code with;
#  2. the 1.37B GLA's e2e decode with gla_int8_all per group (the norms and SwiGLU writing its GEMMs' codes, o_proj's
#     input still quantized in a pass of its own), bf16 beside it;
#  3. gla-small's perplexity per group through the kernels, 16,384 tokens (the CPU run is committed in
#     eval/results/per_group_h200/cpu/; SKIP_PPL=1 skips it).
#   run: bash tools/device_kernels.sh 560 device_per_group_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
timeout 420 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider -m gpu tests/test_per_group_gemm.py \
  tests/test_fused_layer_ops.py tests/test_int8_gemm_kernel.py tests/test_gemm_decode.py tests/test_gla_model.py \
  tests/test_quantizing_rowwise.py tests/test_graphed_step.py > "$W/gpu_tests_gemm.log" 2>&1
log "gemm and producer gpu tests rc $?"
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
timeout 600 laquant eval speed --suite e2e --recipe gla_int8_all --set projections.act_granularity=per_group \
  --batch 1 64 --prompt 4096 --gen 32 --model "config:$CONFIG" --out "$W/e2e_gla_per_group" > "$W/e2e_gla_per_group.log" 2>&1
log "gla e2e per group rc $?"
timeout 400 laquant eval speed --suite e2e --recipe gla_int8_all --batch 64 --prompt 4096 --gen 32 \
  --model "config:$CONFIG" --out "$W/e2e_gla_per_token" > "$W/e2e_gla_per_token.log" 2>&1
log "gla e2e per token rc $?"
[ -n "${SKIP_PPL:-}" ] || timeout 400 python3 tools/ablation.py --device cuda --max-tokens 16384 --quiet \
  --recipes gla_int8_all gla_int8_all,projections.act_granularity=per_group --out "$W/ablation_gla-small_cuda" \
  > "$W/ablation_cuda.log" 2>&1
log "ablation cuda rc $?"
touch "$W/job.done"
