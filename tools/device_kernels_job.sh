#!/usr/bin/env bash
# The background job of device_kernels.sh: GPU tests, speed suites, GPU ablation. $1: work folder.
W=$1
python3 -m pytest -q -rs --timeout 900 tests/test_chunk_kernel.py tests/test_linear_attention_kernel.py \
  tests/test_int8_gemm_kernel.py tests/test_decode_kernel.py tests/test_gpu_model.py > "$W/gpu_tests.log" 2>&1
laquant eval speed --out "$W/speed" --model gla-small \
  'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}' \
  > "$W/speed.log" 2>&1
python3 tools/ablation.py --device cuda --max-tokens 65536 --quiet \
  --recipes gla_int8 gla_int8_all gla_fp8_state --out "$W/ablation_gla-small_gpu" > "$W/ablation.log" 2>&1
touch "$W/job.done"
