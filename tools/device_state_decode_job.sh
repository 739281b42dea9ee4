#!/usr/bin/env bash
# Issue #14, the 8-bit state's decode step on its bit patterns: the decode kernels' launch sweep (it
# rewrites kernels/common/state_io.py's tables, copied to $W), the state kernels' tests on the GPU and the
# models' GPU tests (quantizing_rowwise's included), then the e2e decode of the 1.14B qwen3_next (bf16 vs
# hybrid_int8) with the B = 64 step's profile, of a Qwen3.5 of the same shape, and of the 1.37B GLA
# (bf16 vs gla_int8_all).
# Run by `bash tools/device_kernels.sh WAIT device_state_decode_job.sh`. $1: work folder.
set -u
. tools/device_job_env.sh "$@"
timeout 400 python3 tools/sweep_kernels.py state_decode --write > "$W/sweep_state_decode.log" 2>&1
log "sweep rc $?"
cp kernels/common/state_io.py "$W/state_io.py"
# the state kernels' test files whole (their tests are not marked gpu: they run on the GPU where there is one)
timeout 900 python3 -m pytest -q -rfs --tb=short tests/test_stochastic_rounding.py tests/test_decode_kernel.py \
  tests/test_delta_kernels.py tests/test_verify.py tests/test_store_kernel.py tests/test_kda_kernels.py \
  tests/test_chunk_kernel.py tests/test_int4_state.py tests/test_fused_layer_ops.py > "$W/gpu_tests_kernels.log" 2>&1
log "kernel tests rc $?"
timeout 600 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_gpu_model.py tests/test_static_hybrid.py \
  tests/test_generate.py tests/test_speculative.py tests/test_quantizing_rowwise.py > "$W/gpu_tests_models.log" 2>&1
log "model gpu tests rc $?"
bash tools/device_hybrid_e2e.sh "$W"
# Qwen3.5's shape of the same size: its norms, SwiGLUs and gated norm on the codes path (not GPU-measured before)
QWEN35='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "vocab_size": 32000}'
timeout 600 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "qwen3_5_text:$QWEN35" --out "$W/e2e_qwen3_5" > "$W/e2e_qwen3_5.log" 2>&1
log "qwen3_5 e2e rc $?"
bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
