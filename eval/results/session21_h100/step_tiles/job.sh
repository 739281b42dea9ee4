#!/usr/bin/env bash
# Issue #14 on an H100: configs.STEP_TABLES (GEMM tiles re-chosen inside the graphed decode step) has H200 entries
# only. tools/sweep_step_tiles.py --write on the H100 for the 1.37B GLA (gla_int8_all) at B = 64, then B = 1, into a
# private copy of the package; the GEMM GPU tests on it; the GLA's e2e (prompt 1,024, graphed B = 1 and 64) with the
# written overlays against this tree's, alternated. The written configs.py / state_io.py come back.
#   run: bash tools/device_kernels.sh 560 device_h100_step_tiles_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
private_pkg "$W/pkg"
sweep() {  # NAME ARGS...
  local name=$1; shift
  (cd tools && PYTHONPATH="$W/pkg:$PYTHONPATH" timeout 300 python3 sweep_step_tiles.py "$W/step_$name.json" --write \
    "$@") > "$W/step_$name.log" 2>&1
  log "sweep $name rc $?"
}
sweep gla_b64 --batch 64
sweep gla_b1 --batch 1
cp "$W/pkg/laquant/kernels/gemm/configs.py" "$W/configs_written.py"
cp "$W/pkg/laquant/kernels/common/state_io.py" "$W/state_io_written.py"
PYTHONPATH="$W/pkg:$PYTHONPATH" timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gemm_decode.py \
  > "$W/gpu_tests_gemm.log" 2>&1
log "gemm tests rc $?"
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
rep=0
for tag in _new _tree _new _tree; do
  rep=$((rep + 1))
  path=$PYTHONPATH; [ $tag = _new ] && path="$W/pkg:$PYTHONPATH"
  PYTHONPATH="$path" timeout 120 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 \
    --prompt 1024 --gen 32 --no-profile --model "$CFG" --out "$W/e2e_gla${tag}_$rep" > "$W/e2e_gla${tag}_$rep.log" 2>&1
  log "e2e gla$tag $rep rc $?"
done
rm -rf "$W/pkg"
touch "$W/job.done"
