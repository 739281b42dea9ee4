#!/usr/bin/env bash
# Issue #19 (2026-11-30, second session): the verify step with numerics "prefill" as one prefill chunk. The GPU tests
# of the verify step's prefill numerics first; the verify bench at B = 64 on the checkout before (scratch/base_pkg,
# cfaaf7f: *_base) and on this one; the launch sweep of the new kernels (B = 1, 8, 64), written into this copy's
# kernels/common/state_io.py (brought back as state_io.py); the bench again on the swept table; prompt-lookup
# speculative decoding of gla-small's gla_int8 form (B = 1) and of a 1.37B random target's round (B = 64); the
# speculative GPU tests.
#   run: bash tools/device_kernels.sh 560 device_verify_chunk_job.sh   (carry .whl and scratch)
set -u
. tools/device_job_env.sh "$@"
FORMATS="int8_row:stochastic fp8_row:stochastic bf16 fp32"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_verify.py -k "prefill or extreme" \
  > "$W/gpu_tests_chunk.log" 2>&1
log "chunk gpu tests rc $?"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 150 python3 tools/bench_verify.py --no-speculative --batch 64 --tokens 4 8 \
  --formats $FORMATS --out "$W/verify_bench_base" > "$W/verify_bench_base.log" 2>&1
log "verify bench base rc $?"
timeout 240 python3 tools/sweep_kernels.py verify --steps verify_prefill --batches 1 8 64 --jobs 16 \
  --formats int8_row fp8_row bf16 fp32 --out "$W/sweep_prefill.jsonl" > "$W/sweep_prefill.log" 2>&1
log "sweep rc $?"
python3 tools/sweep_kernels.py verify --write --from "$W/sweep_prefill.jsonl" >> "$W/sweep_prefill.log" 2>&1
log "write rc $?"
cp kernels/common/state_io.py "$W/state_io.py"
timeout 150 python3 tools/bench_verify.py --no-speculative --batch 1 64 --tokens 4 8 \
  --formats $FORMATS --out "$W/verify_bench" > "$W/verify_bench.log" 2>&1
log "verify bench rc $?"
MODEL="$PWD/laquant/assets/gla-small"
timeout 200 python3 tools/bench_verify.py --out "$W/ngram_b1" --model "$MODEL" --no-kernels --draft ngram \
  --draft-tokens 4 8 --verify-numerics decode prefill --prompt-offsets 0 5000 > "$W/ngram_b1.log" 2>&1
log "ngram b1 rc $?"
timeout 240 python3 tools/bench_verify.py --out "$W/ngram_b64" --model "$MODEL" --no-kernels --draft ngram \
  --draft-tokens 4 8 --spec-batch 64 --new-tokens 128 --verify-numerics decode prefill --prompt-offsets 0 \
  --timing-target '{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16}' > "$W/ngram_b64.log" 2>&1
log "ngram b64 rc $?"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_speculative.py -k "gpu or numerics" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
