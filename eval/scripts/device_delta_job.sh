#!/usr/bin/env bash
# The delta-rule session's GPU work (device_kernels.sh WAIT device_delta_job.sh; carry the fla wheels):
# 1. GPU tests of the delta-rule kernels, the GLA kernels (shared numerics) and the hybrids on them;
# 2. launch-parameter sweeps of the delta-rule decode and prefill kernels;
# 3. the delta_decode / delta_prefill speed suites against fla.
W=$1
set -x
python3 -m pytest -q tests/test_delta_kernels.py tests/test_decode_kernel.py tests/test_chunk_kernel.py \
  > "$W/kernel_tests.log" 2>&1
python3 -m pytest -q -m gpu tests/test_hybrid.py tests/test_gpu_model.py > "$W/gpu_tests.log" 2>&1
python3 eval/scripts/sweep_kernels.py delta_decode > "$W/sweep_delta_decode.log" 2>&1
for cfg in "16 64 4" "16 128 4" "16 128 8" "32 64 4" "32 128 4" "32 128 8" "64 128 4" "64 128 8" "16 32 4" "32 32 4"; do
  timeout 120 python3 eval/scripts/sweep_kernels.py delta_prefill 4096 $cfg >> "$W/sweep_delta_prefill.log" 2>&1 \
    || echo "config $cfg failed" >> "$W/sweep_delta_prefill.log"
done
python3 -m laquant.cli eval speed --suite delta_decode delta_prefill --out "$W/speed_delta" > "$W/speed_delta.log" 2>&1
touch "$W/job.done"
