#!/usr/bin/env bash
# Issue #19: the one-chunk verify (numerics "prefill") with bf16 products for bf16 inputs and the token-by-token
# fallback: its GPU tests, its launch sweep (B = 1, 8, 64, every format) written into this copy's
# kernels/common/state_io.py (brought back as state_io.py), tools/exp_verify_chunk.py at the e2e shapes on the swept
# table, the speculative GPU tests, and prompt lookup's round on a 1.37B random gla_int8 target at B = 64.
#   run: bash tools/device_kernels.sh 540 device_verify_chunk3_job.sh   (carry .whl)
set -u
. tools/device_job_env.sh "$@"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_verify.py -k "prefill or extreme" \
  > "$W/gpu_tests_chunk.log" 2>&1
log "chunk gpu tests rc $?"
timeout 200 python3 tools/sweep_kernels.py verify --steps verify_prefill --batches 1 8 64 --jobs 16 \
  --formats int8_row fp8_row bf16 fp32 --out "$W/sweep_prefill.jsonl" > "$W/sweep_prefill.log" 2>&1
log "sweep rc $?"
python3 tools/sweep_kernels.py verify --write --from "$W/sweep_prefill.jsonl" >> "$W/sweep_prefill.log" 2>&1
log "write rc $?"
cp kernels/common/state_io.py "$W/state_io.py"
timeout 90 python3 tools/exp_verify_chunk.py "$W/e2e_shapes.json" --formats int8_row:stochastic bf16 \
  > "$W/e2e_shapes.log" 2>&1
log "e2e shapes rc $?"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_speculative.py -k "gpu or numerics" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 150 python3 tools/bench_verify.py --out "$W/ngram_b64" --model "$PWD/laquant/assets/gla-small" --no-kernels \
  --draft ngram --draft-tokens 4 8 --spec-batch 64 --new-tokens 128 --verify-numerics decode prefill \
  --prompt-offsets 0 --timing-target '{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16}' \
  > "$W/ngram_b64.log" 2>&1
log "ngram b64 rc $?"
touch "$W/job.done"
