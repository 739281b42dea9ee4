#!/usr/bin/env bash
# Issue #14: tools/sweep_step_tiles.py --write on the e2e models (qwen3_next and Kimi Linear hybrids at B = 64, the
# 1.37B GLA at B = 1 and 64), each sweep starting from what the ones before kept; then the tabled launches' GPU tests
# and the e2e of this tree (the overlays written) against the checkout before (scratch/base_pkg: the same code, empty
# overlays), alternated. The files with the overlays written come back.
#   run: bash tools/device_kernels.sh 560 device_step_tiles_write_job.sh   (carry scratch/base_pkg)
set -u
. tools/device_job_env.sh "$@"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
QWEN='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
sweep() {  # NAME ARGS...
  local name=$1; shift
  (cd tools && timeout 240 python3 sweep_step_tiles.py "$W/step_$name.json" --write "$@") > "$W/step_$name.log" 2>&1
  log "sweep $name rc $?"
}
sweep qwen3_next_b64 --model "qwen3_next:$QWEN"
sweep kimi_linear_b64 --model "kimi_linear:$(python3 tools/family_configs.py kimi_linear)"
sweep gla_b1 --batch 1
sweep gla_b64 --batch 64
cp kernels/gemm/configs.py kernels/common/state_io.py "$W/"
timeout 120 python3 -m pytest -q tests/test_decode_kernel.py tests/test_delta_kernels.py -k "tabled or step_decode" \
  > "$W/gpu_tests_launches.log" 2>&1
log "gpu tests launches rc $?"
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
rep=0
for tag in _new _base _base _new; do
  rep=$((rep + 1))
  path=$PYTHONPATH; [ $tag = _base ] && path="$BASE:$PYTHONPATH"
  PYTHONPATH="$path" timeout 150 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 \
    --prompt 1024 --gen 32 --no-profile --model "$CFG" --out "$W/e2e_gla${tag}_$rep" > "$W/e2e_gla${tag}_$rep.log" 2>&1
  log "e2e gla$tag $rep rc $?"
done
for tag in _new _base; do
  E2E_TIMEOUT=200 hybrid_e2e qwen3_next "$tag" "$QWEN" --no-profile
done
touch "$W/job.done"
