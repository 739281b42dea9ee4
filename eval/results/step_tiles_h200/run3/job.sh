#!/usr/bin/env bash
# Issue #14: the committed step overlays (STEP_DECODE_LAUNCH's delta-rule int8 catch-all, STEP_TABLES' 6144x2048 at
# M = 64) against the checkout before (scratch/base_pkg, empty overlays) on the qwen3_next e2e at B = 64, alternated.
#   run: bash tools/device_kernels.sh 300 device_step_confirm_job.sh   (carry scratch/base_pkg)
set -u
. tools/device_job_env.sh "$@"
QWEN='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
run() { E2E_TIMEOUT=100 hybrid_e2e qwen3_next "$1" "$QWEN" --no-profile --batch 64; }
run _new
for rep in 1 2; do  # the base's output names carry no repetition: moved aside
  run _base
  mv "$W/e2e_qwen3_next_base" "$W/e2e_qwen3_next_base$rep"; mv "$W/e2e_qwen3_next_base.log" "$W/e2e_qwen3_next_base$rep.log"
done
run _new2
touch "$W/job.done"
