#!/usr/bin/env bash
# Issue #14: the per-group producers (act_granularity per_group) timed. SwiGLU now spreads a token's row over programs
# of GLU_GROUP_BLOCK columns (a group's scale needs no other group); the norms write per-group codes from a token's
# row. Steps (each logs its end in status.log):
#  1. the per-group tests on the GPU (the producers' codes against quantize_groups, bit for bit; the GLA's steps);
#  2. the producers alone, per token and per group, this tree and the checkout in $BASE (scratch/base_pkg, carried:
#     the per-group SwiGLU of one program a token), CUDA-graph medians;
#  3. the 1.37B GLA's e2e decode with gla_int8_all per group, bf16 beside it.
#   run: bash tools/device_kernels.sh 560 device_group_producers_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider tests/test_per_group_gemm.py ${TEST_K:+-k "$TEST_K"} \
  > "$W/gpu_tests.log" 2>&1
log "per-group gpu tests rc $?"
[ -z "${SKIP_BENCH:-}" ] && timeout 240 python3 tools/bench_codes_producers.py --act per_token per_group --M 1 64 --label new \
  --out "$W/producers_new.json" > "$W/producers_new.log" 2>&1
log "producers new rc $?"
[ -z "${SKIP_BASE:-}" ] && have_base && PYTHONPATH="$BASE:$PYTHONPATH" timeout 240 python3 tools/bench_codes_producers.py --act per_group \
  --M 1 64 --label base --out "$W/producers_base.json" > "$W/producers_base.log" 2>&1
log "producers base rc $?"
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
timeout 400 laquant eval speed --suite e2e --recipe gla_int8_all --set projections.act_granularity=per_group \
  --batch 1 64 --prompt 4096 --gen 32 --model "config:$CONFIG" --out "$W/e2e_gla_per_group" > "$W/e2e_gla_per_group.log" 2>&1
log "gla e2e per group rc $?"
touch "$W/job.done"
