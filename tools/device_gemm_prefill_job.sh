#!/usr/bin/env bash
# Issue #14 item 5, prefill: the tiled int8 GEMM's tiles at prefill sizes (tools/sweep_gemm_prefill.py), then the
# 1.14B qwen3_next's e2e at B = 1 with a 4,096-token prompt, where its prefill is bound by the GPU, not the host.
# Run by `bash tools/device_kernels.sh WAIT device_gemm_prefill_job.sh`. $1: work folder.
set -u
. tools/device_job_env.sh "$@"
if [ -z "${SKIP_SWEEP:-}" ]; then  # SKIP_SWEEP=1: the e2e only
  timeout 420 python3 tools/sweep_gemm_prefill.py "$W" > "$W/sweep_gemm_prefill.log" 2>&1
  log "sweep rc $?"
fi
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
timeout 400 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 --prompt 4096 --gen 32 \
  --model "qwen3_next:$CONFIG" --out "$W/e2e_hybrid_4k" > "$W/e2e_hybrid_4k.log" 2>&1
log "hybrid e2e 4k rc $?"
touch "$W/job.done"
