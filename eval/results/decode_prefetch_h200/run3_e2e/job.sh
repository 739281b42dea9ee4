#!/usr/bin/env bash
# Issue #14: the 1.37B GLA's e2e (`laquant eval speed --suite e2e`, graphed decode at B = 1 and 64) with the GLA int8
# decode walk's prefetch (the shipped tables) and without it (the tables before: DECODE_PREFETCH empty, the 16-row
# step launch), alternated, per token and with per-group output codes; then the decode kernel's GPU tests.
#   run: bash tools/device_kernels.sh 560 device_decode_prefetch_e2e_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
e2e() {  # e2e TAG WITHOUT_PREFETCH(0/1) [--set ...]
  local tag=$1 off=$2
  shift 2
  timeout 90 python3 -c "
import sys
from laquant.kernels.common import state_io
if $off:
    state_io.DECODE_PREFETCH.clear()
    state_io.STEP_DECODE_LAUNCH.pop(('gla', 'int8_row', None), None)
from laquant.cli import main
sys.argv = ['laquant'] + sys.argv[1:]
sys.exit(main())" eval speed --suite e2e --recipe gla_int8_all "$@" --batch 1 64 --prompt 1024 --gen 32 --no-profile \
    --model "$CFG" --out "$W/e2e_$tag" > "$W/e2e_$tag.log" 2>&1
  log "e2e $tag rc $?"
}
e2e before_1 1
e2e after_1 0
e2e after_2 0
e2e before_2 1
e2e outputs_after 0 --set projections.output_act_granularity=per_group
e2e outputs_before 1 --set projections.output_act_granularity=per_group
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_decode_kernel.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
