#!/usr/bin/env bash
# Issue #14: the per-group GEMMs load each K step's activation scales one step ahead (they were loaded beside their
# products, an L2 round trip on every step's critical path). This tree against the checkout before the change
# (scratch/base_pkg, carried; *_base), each step logging its end in status.log:
#  1. the per-group GEMM alone (tools/sweep_group_gemm.py, M = 64 and prefill, the committed tiles in the "rule"
#     column), this tree then the base;
#  2. the 1.37B GLA's e2e with gla_int8_all per group, B = 1 and 64, this tree then the base (bf16 in each);
#  3. the per-group GPU tests.
#   run (as tools/device_group_scales_job.sh): bash tools/device_kernels.sh 560 device_group_scales_job.sh
# NOTE: scratch/base_pkg is git-ignored; a call must carry it (run's carry) or the "base" half runs this tree.
set -u
. tools/device_job_env.sh "$@"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
timeout 200 python3 tools/sweep_group_gemm.py --out "$W/gemm_new" --buckets ${GROUP_BUCKETS:-64,prefill} > "$W/gemm_new.log" 2>&1
log "gemm new rc $?"
# the tool puts its own checkout first on sys.path: a copy beside the base package imports the base
mkdir -p "$BASE/tools" && cp tools/sweep_group_gemm.py "$BASE/tools/"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 200 python3 "$BASE/tools/sweep_group_gemm.py" --out "$W/gemm_base" \
  --buckets ${GROUP_BUCKETS:-64,prefill} > "$W/gemm_base.log" 2>&1
log "gemm base rc $?"
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
for tag in "" _base; do
  path=$PYTHONPATH
  [ "$tag" = _base ] && path="$BASE:$PYTHONPATH"
  PYTHONPATH="$path" timeout 200 laquant eval speed --suite e2e --recipe gla_int8_all \
    --set projections.act_granularity=per_group --batch 1 64 --prompt 4096 --gen 32 --model "config:$CONFIG" \
    --out "$W/e2e_gla_per_group$tag" > "$W/e2e_gla_per_group$tag.log" 2>&1
  log "gla e2e per group$tag rc $?"
done
timeout 200 python3 -m pytest -v -rfs --tb=short -p no:cacheprovider tests/test_per_group_gemm.py > "$W/gpu_tests.log" 2>&1
log "per-group gpu tests rc $?"
touch "$W/job.done"
