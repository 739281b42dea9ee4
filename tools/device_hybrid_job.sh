#!/usr/bin/env bash
# The hybrid session's GPU work (run by device_kernels.sh WAIT device_hybrid_job.sh):
# 1. GPU tests of the int8 GEMM (padded weight rows) and of the model on the kernels;
# 2. the GEMM speed suite again on the padded layout;
# 3. peak GPU memory of calibration, whole model vs layer by layer (1.37B random-weight GLA);
# 4. training the qwen3_next-style hybrid reference model (tools/train.py --arch qwen3_next).
W=$1
set -x
python3 -m pytest -q -x -m gpu tests/test_int8_gemm_kernel.py tests/test_gpu_model.py > "$W/gpu_tests.log" 2>&1
python3 -m laquant.cli eval speed --suite gemm --out "$W/speed_gemm" > "$W/speed_gemm.log" 2>&1
python3 tools/calib_memory.py \
  'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}' \
  --samples 32 --seq-len 2048 --batch-size 8 --json "$W/calib_memory_1p4b.json" > "$W/calib_memory.log" 2>&1
python3 tools/train.py model --arch qwen3_next --size small --lr 3e-3 --data-dir .devdata \
  --tokenizer laquant/assets/gla-small --out "$W/qwen3next-small" > "$W/train_hybrid.log" 2>&1
touch "$W/job.done"
