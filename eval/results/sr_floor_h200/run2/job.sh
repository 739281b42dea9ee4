#!/usr/bin/env bash
# Issue #14 (2026-12-04), after device_sr_offset_job.sh: the GPU tests that job's time limit cut (the state kernels'
# remaining files, their stochastic and 8-bit cases); the decode kernel's launch re-chosen inside the graphed B = 64
# step for the cheaper rounding (tools/sweep_step_tiles.py --decode-only --write, GLA 1.37B and qwen3_next 1.14B, into
# a private copy of the package: $W/pkg) and, where it changed, the GLA e2e with it against the tree, alternated; the
# per-group GLA e2e (gla_int8_all, act_granularity per_group) on the new rounding.
#   run: bash tools/device_kernels.sh 560 device_sr_followup_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_kda_kernels.py tests/test_chunk_kernel.py \
  tests/test_verify.py tests/test_delta_kernels.py -k "stochastic or int8 or fp8 or _row or state" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
private_pkg "$W/pkg"
P="$W/pkg:$PYTHONPATH"
QWEN=$(python3 tools/family_configs.py qwen3_next)
(cd tools && PYTHONPATH="$P" timeout 150 python3 sweep_step_tiles.py "$W/step_gla_b64.json" --decode-only --write) \
  > "$W/step_gla_b64.log" 2>&1
log "sweep gla rc $?"
(cd tools && PYTHONPATH="$P" timeout 150 python3 sweep_step_tiles.py "$W/step_qwen3_next_b64.json" --decode-only \
  --write --model "qwen3_next:$QWEN") > "$W/step_qwen3_next_b64.log" 2>&1
log "sweep qwen3_next rc $?"
cp "$W/pkg/laquant/kernels/common/state_io.py" "$W/state_io_written.py"
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
timeout 300 laquant eval speed --suite e2e --recipe gla_int8_all --set projections.act_granularity=per_group \
  --batch 1 64 --prompt 4096 --gen 32 --no-profile --model "$CFG" --out "$W/e2e_gla_per_group" \
  > "$W/e2e_gla_per_group.log" 2>&1
log "e2e per group rc $?"
if ! cmp -s "$W/state_io_written.py" kernels/common/state_io.py; then
  rep=0
  for tag in _new _tree _tree _new; do
    rep=$((rep + 1))
    path=$PYTHONPATH; [ $tag = _new ] && path="$P"
    PYTHONPATH="$path" timeout 150 laquant eval speed --suite e2e --recipe gla_int8_all --batch 64 --prompt 1024 \
      --gen 32 --no-profile --model "$CFG" --out "$W/e2e_gla${tag}_$rep" > "$W/e2e_gla${tag}_$rep.log" 2>&1
    log "e2e gla$tag $rep rc $?"
  done
fi
touch "$W/job.done"
