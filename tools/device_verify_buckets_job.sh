#!/usr/bin/env bash
# The verify kernels' launch by batch size (issue #19): the verify sweep at B = 1 and 8 (fp32 and int8 states; the
# table's B = 64 catch-alls stay) written into the tree's table here, the GPU tests of the decode and verify kernels
# on the new tables, and prompt-lookup speculative decoding on gla-small (gla_int8, three WikiText-2 prompts, k = 4, 8)
# against the checkout before (scratch/base_pkg first on PYTHONPATH, *_base). Carry scratch.
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 300 python3 tools/sweep_kernels.py verify --batches 1 8 --formats fp32 int8_row:stochastic --jobs 12 \
  --out "$W/verify_sweep.jsonl" --write > "$W/verify_sweep.log" 2>&1
log "sweep rc $?"
cp kernels/common/state_io.py "$W/state_io.py"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_decode_kernel.py tests/test_verify.py \
  tests/test_delta_kernels.py -k "decode or verify or commit" > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
OFFSETS="0 5000 20000"
MODEL="$PWD/laquant/assets/gla-small"
timeout 200 python3 tools/bench_verify.py --out "$W/ngram_int8" --model "$MODEL" --no-kernels --draft ngram \
  --draft-tokens 4 8 --prompt-offsets $OFFSETS > "$W/ngram_int8.log" 2>&1
log "ngram rc $?"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 200 python3 tools/bench_verify.py --out "$W/ngram_int8_base" --model "$MODEL" \
  --no-kernels --draft ngram --draft-tokens 4 8 --prompt-offsets $OFFSETS > "$W/ngram_int8_base.log" 2>&1
log "ngram base rc $?"
touch "$W/job.done"
