#!/usr/bin/env bash
# Issue #19: the verify kernels on the swept tables (tools/sweep_kernels.py verify): the verify bench at B = 1 and 64
# (4 and 8 tokens), B = 1 against the checkout before the tables (scratch/base_pkg, carried, first on PYTHONPATH:
# *_base), the verify kernels' tests on the GPU, and prompt-lookup speculative decoding on gla-small (gla_int8, three
# WikiText-2 prompts, k = 4, 8) with and without the new tables.
#   run: bash tools/device_kernels.sh 560 device_verify_final_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
(cd /tmp && PYTHONPATH="$BASE:$PYTHONPATH" python3 -c "import laquant; print('base:', laquant.__file__)") \
  >> "$W/status.log" 2>&1
timeout 240 python3 tools/bench_verify.py --no-speculative --batch 1 64 --tokens 4 8 \
  --formats int8_row:stochastic bf16 fp32 --out "$W/verify_bench" > "$W/verify_bench.log" 2>&1
log "bench rc $?"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 200 python3 tools/bench_verify.py --no-speculative --batch 1 --tokens 4 8 \
  --formats int8_row:stochastic bf16 fp32 --out "$W/verify_bench_base" > "$W/verify_bench_base.log" 2>&1
log "bench base rc $?"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_verify.py > "$W/gpu_tests_verify.log" 2>&1
log "verify tests rc $?"
OFFSETS="0 5000 20000"
MODEL="$PWD/laquant/assets/gla-small"  # the tree's, for both checkouts (the carried one leaves it out)
timeout 300 python3 tools/bench_verify.py --out "$W/ngram_int8" --model "$MODEL" --no-kernels --draft ngram \
  --draft-tokens 4 8 --prompt-offsets $OFFSETS > "$W/ngram_int8.log" 2>&1
log "ngram rc $?"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 300 python3 tools/bench_verify.py --out "$W/ngram_int8_base" --model "$MODEL" \
  --no-kernels --draft ngram --draft-tokens 4 8 --prompt-offsets $OFFSETS > "$W/ngram_int8_base.log" 2>&1
log "ngram base rc $?"
touch "$W/job.done"
