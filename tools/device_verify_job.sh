#!/usr/bin/env bash
# GPU verification after a kernel change (device_kernels.sh WAIT device_verify_job.sh; carry the fla wheels):
# every Triton kernel against its reference, the models and hybrids on the kernels, then a quick run
# of the state kernels' speed suites (decode, prefill, delta_decode, delta_prefill) against fla.
W=$1
set -x
python3 -m pytest -q tests/test_chunk_kernel.py tests/test_decode_kernel.py tests/test_delta_kernels.py \
  tests/test_linear_attention_kernel.py tests/test_int8_gemm_kernel.py > "$W/kernel_tests.log" 2>&1
python3 -m pytest -q -m gpu tests/test_gpu_model.py tests/test_hybrid.py > "$W/gpu_tests.log" 2>&1
python3 -m laquant.cli eval speed --quick --suite decode prefill delta_decode delta_prefill --out "$W/speed_quick" \
  > "$W/speed_quick.log" 2>&1
touch "$W/job.done"
