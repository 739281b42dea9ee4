#!/usr/bin/env bash
# Issue #14: the committed step overlays (STEP_DECODE_LAUNCH's delta-rule int8 catch-all, STEP_TABLES' 6144x2048 at
# M = 64) against the checkout before (scratch/base_pkg, empty overlays) on the qwen3_next e2e at B = 64, alternated.
#   run: bash tools/device_kernels.sh 300 device_step_confirm_job.sh   (carry scratch/base_pkg)
set -u
. tools/device_job_env.sh "$@"
QWEN='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
for tag in _new _base; do E2E_TIMEOUT=100 hybrid_e2e qwen3_next "$tag" "$QWEN" --no-profile --batch 64; done
for tag in _new2 _base2; do
  t=$tag; [ $tag = _base2 ] && t=_base
  E2E_TIMEOUT=100 hybrid_e2e qwen3_next "$t" "$QWEN" --no-profile --batch 64
  mv "$W/e2e_qwen3_next$t" "$W/e2e_qwen3_next$tag" 2>/dev/null; mv "$W/e2e_qwen3_next$t.log" "$W/e2e_qwen3_next$tag.log"
done
touch "$W/job.done"
