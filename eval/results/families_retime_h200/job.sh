#!/usr/bin/env bash
# Issue #14: the transformers hybrid families' e2e decode re-timed on today's tree (bf16 vs hybrid_int8, graphed,
# B = 1 and 64, prompt 1,024, 32 steps, no profile), those whose README ratios date from before the state rounding
# and the decode walk's prefetch of 2026-12-04: Qwen3.5 (the 1.1B shape of device_state_decode_job.sh), Kimi Linear,
# Mamba-2, Bamba, OLMo hybrid, Granite 4, Zamba2, MiniMax, Falcon-H1 (tools/family_configs.py's configs).
#   run: bash tools/device_kernels.sh 560 device_families_retime_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
QWEN35='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "vocab_size": 32000}'
hybrid_e2e qwen3_5_text "" "$QWEN35" --no-profile
for fam in ${FAMILIES:-kimi_linear mamba2 bamba granitemoehybrid olmo_hybrid zamba2 minimax falcon_h1}; do
  hybrid_e2e "$fam" "" "" --no-profile
done
touch "$W/job.done"
