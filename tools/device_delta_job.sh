#!/usr/bin/env bash
# The delta-rule session's GPU work (device_kernels.sh WAIT device_delta_job.sh; carry the fla wheels):
# 1. GPU tests of the delta-rule kernels and of the hybrids on the kernels;
# 2. the delta_decode / delta_prefill speed suites against fla.
W=$1
set -x
python3 -m pytest -q tests/test_delta_kernels.py > "$W/kernel_tests.log" 2>&1
python3 -m pytest -q -m gpu tests/test_hybrid.py > "$W/gpu_tests.log" 2>&1
python3 -m laquant.cli eval speed --suite delta_decode delta_prefill --out "$W/speed_delta" > "$W/speed_delta.log" 2>&1
touch "$W/job.done"
