#!/usr/bin/env bash
# Issue #14 on an H100: STEP_DECODE_LAUNCH is keyed by GPU since 2026-12-06; its entries were the H200's and served
# every GPU. tools/sweep_step_tiles.py --decode-only --write on the H100 (the 1.37B GLA at B = 64, then the dense
# qwen3_next's delta rule) into a private copy of the package; the tabled launches' GPU tests on it; issue #14's GLA
# benchmark on it (tools/device_gla_e2e.sh 1b). The written state_io.py comes back (to commit its generated block).
#   run: bash tools/device_kernels.sh 560 device_h100_step_launch_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
private_pkg "$W/pkg"
export PYTHONPATH="$W/pkg:$PYTHONPATH"
QWEN='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
sweep() {  # NAME ARGS...
  local name=$1; shift
  (cd tools && timeout 300 python3 sweep_step_tiles.py "$W/step_$name.json" --decode-only --write "$@") \
    > "$W/step_$name.log" 2>&1
  log "sweep $name rc $?"
}
sweep gla_b64 --batch 64
sweep qwen3_next_b64 --model "qwen3_next:$QWEN"
cp "$W/pkg/laquant/kernels/common/state_io.py" "$W/state_io_written.py"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_decode_kernel.py tests/test_delta_kernels.py \
  -k "tabled or step_decode or pool_args or prefetch" > "$W/gpu_tests_launches.log" 2>&1
log "gpu tests launches rc $?"
bash tools/device_gla_e2e.sh "$W" 1b
rm -rf "$W/pkg"
touch "$W/job.done"
