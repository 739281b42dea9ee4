#!/usr/bin/env bash
# The follow-up request's prefill replayed as a CUDA graph (laquant/serving/graphed_prefill.py, written
# 2026-11-27 without a GPU) and the cheaper host side of the quantized forward (laquant/quant/fused.py,
# kernels/gemm/configs.py), checked and timed: first the GPU tests of the graphed prefill, the prefix cache,
# the fused projections and the model, then the prefill profile (tools/profile_prefill.py; before:
# eval/results/store_kernel_h200/profile_prefill.json), the 1.3B follow-up TTFT with the graphed resume
# (eval serve; before: store_kernel_h200/serve_gla_1b), where an eager hybrid decode step's time goes
# (tools/profile_hybrid_decode.py: the 64K hybrid runs decoded at 10-16 tok/s). Results under $1, one status line a step.
#   run: bash tools/device_kernels.sh 560 device_graphed_prefill_job.sh
set -u
W=$1
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)" > "$W/versions.txt" 2>&1
timeout 600 python3 -m pytest -q -rfs --tb=short tests/test_graphed_prefill.py tests/test_prefix_cache.py \
  tests/test_fused_layer_ops.py tests/test_gpu_model.py tests/test_generate.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 300 python3 tools/profile_prefill.py "$W/profile_prefill.json" 64 256 4096 > "$W/profile_prefill.log" 2>&1
log "profile rc $?"
timeout 500 laquant eval serve 'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 4, "vocab_size": 32000}' \
  --recipe gla_int8 --system 4096 --user 64 --reply 32 --conversations 4 --turns 3 --block-size 256 --reps 10 \
  --device cuda --quiet --no-accuracy --out "$W/serve_gla_1b" > "$W/serve.log" 2>&1
log "serve rc $?"
timeout 300 python3 tools/profile_hybrid_decode.py "$W/profile_hybrid_decode.json" > "$W/profile_hybrid_decode.log" 2>&1
log "hybrid decode profile rc $?"
touch "$W/job.done"
