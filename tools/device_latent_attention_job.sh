#!/usr/bin/env bash
# MLA's absorbed decode attention as one kernel (kernels/attention/latent.py, issue #14): its GPU tests and Kimi Linear's
# graphed / MoE tests, then Kimi Linear's e2e against the checkout before (scratch/base_pkg, first on PYTHONPATH) in the
# same job, its graphed B = 64 step kernel by kernel, and a Qwen3.5 e2e on today's code (last timed 2026-11-26).
#   run: bash tools/device_kernels.sh 560 device_latent_attention_job.sh   (carry .whl and scratch)
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_latent_attention.py tests/test_static_hybrid.py \
  -k "latent or kimi" > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
hybrid_e2e kimi_linear ""
hybrid_e2e kimi_linear _base
timeout 150 python3 tools/graph_timeline.py "$W/timeline_kimi_linear.json" --prompt 1024 \
  --model "kimi_linear:$(python3 tools/family_configs.py kimi_linear)" > "$W/timeline_kimi_linear.log" 2>&1
log "kimi timeline rc $?"
QWEN35='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "vocab_size": 32000}'
timeout 150 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "qwen3_5_text:$QWEN35" --out "$W/e2e_qwen3_5" > "$W/e2e_qwen3_5.log" 2>&1
log "qwen3_5 e2e rc $?"
touch "$W/job.done"
