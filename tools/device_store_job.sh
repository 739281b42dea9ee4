#!/usr/bin/env bash
# The prefill's state store as one Triton kernel (kernels/common/store.py, 2026-11-27, written without a
# GPU) checked and timed on one: first the GPU tests of everything that stores a prefill's state (the
# store kernel, the chunk kernels, the model on the GPU, the prefix cache, speculative decoding), then the
# prefill profile of the 1.3B-shaped GLA (tools/profile_prefill.py: wall against GPU time, kernels, host
# syncs; before: eval/results/serve_1b_h200/profile_prefill_h200.json), the 1.3B follow-up TTFT
# (eval serve), the e2e suite's prefill of the 1.37B GLA, and the int8 GEMM at prefill sizes against cuBLAS
# (tools/bench_prefill_gemm.py: larger Triton tiles, torch._int_mm). Results under $1, one status line a step.
#   run: bash tools/device_kernels.sh 560 device_store_job.sh
set -u
W=$1
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)" > "$W/versions.txt" 2>&1
timeout 900 python3 -m pytest -q -rfs --tb=short tests/test_store_kernel.py tests/test_chunk_kernel.py \
  tests/test_gpu_model.py tests/test_prefix_cache.py tests/test_prefix_cache_hybrid.py tests/test_speculative.py \
  tests/test_stochastic_rounding.py tests/test_generate.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 400 python3 tools/profile_prefill.py "$W/profile_prefill.json" 64 256 4096 > "$W/profile_prefill.log" 2>&1
log "profile rc $?"
timeout 500 laquant eval serve 'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 4, "vocab_size": 32000}' \
  --recipe gla_int8 --system 4096 --user 64 --reply 32 --conversations 4 --turns 3 --block-size 256 --reps 10 \
  --device cuda --quiet --out "$W/serve_gla_1b" > "$W/serve.log" 2>&1
log "serve rc $?"
timeout 600 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 4096 --gen 32 \
  --model 'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}' \
  --out "$W/e2e" > "$W/e2e.log" 2>&1
log "e2e rc $?"
timeout 400 python3 tools/bench_prefill_gemm.py "$W/prefill_gemm.json" > "$W/prefill_gemm.log" 2>&1
log "prefill gemm rc $?"
touch "$W/job.done"
