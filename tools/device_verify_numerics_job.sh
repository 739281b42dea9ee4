#!/usr/bin/env bash
# Issue #19's 8-bit verify and #14's int8 state step (2026-11-30): the verify kernels with numerics "decode" and
# "prefill" at B = 64 (tools/bench_verify.py, every format), prompt-lookup speculative decoding of gla-small's gla_int8
# form at B = 1 and 64 with both numerics, the GPU tests of the changed kernels and paths, the shipped int8 decode
# step without the clamp against the checkout before (scratch/base_pkg, 80eb585: *_base), and the GLA e2e at B = 64
# both ways.
#   run: bash tools/device_kernels.sh 560 device_verify_numerics_job.sh   (carry .whl and scratch)
set -u
. tools/device_job_env.sh "$@"
timeout 150 python3 tools/exp_state_step.py "$W/state_step.json" --shipped > "$W/state_step.log" 2>&1
log "state step rc $?"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 150 python3 tools/exp_state_step.py "$W/state_step_base.json" --shipped \
  > "$W/state_step_base.log" 2>&1
log "state step base rc $?"
timeout 240 python3 tools/bench_verify.py --no-speculative --batch 64 --tokens 4 8 \
  --formats int8_row:stochastic fp8_row:stochastic bf16 fp32 --out "$W/verify_bench" > "$W/verify_bench.log" 2>&1
log "verify bench rc $?"
timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_verify.py tests/test_speculative.py \
  tests/test_decode_kernel.py tests/test_store_kernel.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
MODEL="$PWD/laquant/assets/gla-small"
timeout 300 python3 tools/bench_verify.py --out "$W/ngram_b1" --model "$MODEL" --no-kernels --draft ngram \
  --draft-tokens 4 8 --verify-numerics decode prefill --prompt-offsets 0 5000 > "$W/ngram_b1.log" 2>&1
log "ngram b1 rc $?"
timeout 300 python3 tools/bench_verify.py --out "$W/ngram_b64" --model "$MODEL" --no-kernels --draft ngram \
  --draft-tokens 4 --spec-batch 64 --new-tokens 128 --verify-numerics decode prefill --prompt-offsets 0 \
  --timing-target '{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16}' > "$W/ngram_b64.log" 2>&1
log "ngram b64 rc $?"
E2E_BATCHES=64 bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_BATCHES=64 E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
