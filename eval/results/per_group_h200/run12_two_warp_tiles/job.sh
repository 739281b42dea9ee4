#!/usr/bin/env bash
# Issue #14: the per-group W8A8 GEMM's tiles (tools/sweep_group_gemm.py, M = 64, the 1.37B GLA's shapes) against the
# per-token GEMM in one harness, then the e2e decode with gla_int8_all per group on the swept tiles (a private copy of
# the package with them applied), bf16 beside it; then the per-group GPU tests. Each step logs its end in status.log.
#   run: bash tools/device_kernels.sh 480 device_group_sweep_job.sh   (poll with the same line until JOB DONE)
#   GROUP_BUCKETS (default 64): the sweep's M buckets ("prefill": the tiled kernel at 4,096 tokens, whose e2e number
#   is the prefill's); E2E_BATCHES (default 64); SKIP_TESTS=1 skips the tests; HYBRIDS="qwen3_next ...": also those
#   families' e2e with hybrid_int8, per token and per group (on the swept tiles), after the GLA's. TEST_FILES: the
#   tests' files (default tests/test_per_group_gemm.py).
set -u
. tools/device_job_env.sh "$@"
timeout 280 python3 tools/sweep_group_gemm.py --out "$W/group_gemm" --buckets ${GROUP_BUCKETS:-64} > "$W/group_gemm.log" 2>&1
log "group gemm sweep rc $?"
PKG=/tmp/laqk-group-pkg
private_pkg "$PKG"
python3 tools/sweep_group_gemm.py --apply "$W/group_gemm/group_table.py" --configs "$PKG/laquant/kernels/gemm/configs.py"
log "applied rc $?"
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
PYTHONPATH="$PKG:$PYTHONPATH" timeout 200 laquant eval speed --suite e2e --recipe gla_int8_all \
  --set projections.act_granularity=per_group --batch ${E2E_BATCHES:-64} --prompt 4096 --gen 32 --model "config:$CONFIG" \
  --out "$W/e2e_gla_per_group_swept" > "$W/e2e_gla_per_group_swept.log" 2>&1
log "gla e2e per group swept rc $?"
for fam in ${HYBRIDS:-}; do
  hybrid_e2e "$fam" ""
  PYTHONPATH="$PKG:$PYTHONPATH" hybrid_e2e "$fam" _per_group "" --set projections.act_granularity=per_group
done
[ -n "${SKIP_TESTS:-}" ] || timeout 200 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider ${TEST_FILES:-tests/test_per_group_gemm.py} > "$W/gpu_tests.log" 2>&1
log "per-group gpu tests rc $?"
touch "$W/job.done"
