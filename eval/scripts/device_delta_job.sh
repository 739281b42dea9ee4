#!/usr/bin/env bash
# The delta-rule session's GPU work (device_kernels.sh WAIT device_delta_job.sh; carry the fla wheels):
# 1. launch-parameter sweeps of the delta-rule prefill (fused single kernel vs WY pre-pass + state pass);
# 2. GPU tests of the delta-rule kernels and the hybrids on them;
# 3. the delta_decode / delta_prefill speed suites against fla.
W=$1
set -x
for T in 4096 65536; do
  for cfg in "16 128 4 fused" "16 64 4 fused" "16 32 4 fused" "64 128 4 wy 4" "64 128 8 wy 4" "64 128 8 wy 8" \
             "64 64 4 wy 4" "64 64 8 wy 4" "64 32 4 wy 4"; do
    timeout 150 python3 eval/scripts/sweep_kernels.py delta_prefill $T $cfg >> "$W/sweep_delta_prefill.log" 2>&1 \
      || echo "config $T $cfg failed" >> "$W/sweep_delta_prefill.log"
  done
done
python3 -m pytest -q tests/test_delta_kernels.py > "$W/kernel_tests.log" 2>&1
python3 -m pytest -q -m gpu tests/test_hybrid.py > "$W/gpu_tests.log" 2>&1
python3 -m laquant.cli eval speed --suite delta_prefill --out "$W/speed_delta" > "$W/speed_delta.log" 2>&1
touch "$W/job.done"
