#!/usr/bin/env bash
# GPU tests of the int8 GEMM (gathering activation pass), the model on the kernels and the hybrids'
# Lightning / Mamba2 mixers on the GLA kernels, then the GEMM speed suite (device_kernels.sh WAIT device_verify_job.sh).
W=$1
set -x
python3 -m pytest -q -m gpu tests/test_int8_gemm_kernel.py tests/test_gpu_model.py tests/test_hybrid.py > "$W/gpu_tests.log" 2>&1
python3 -m laquant.cli eval speed --suite gemm --out "$W/speed_gemm" > "$W/speed_gemm.log" 2>&1
touch "$W/job.done"
