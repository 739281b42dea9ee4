#!/usr/bin/env bash
# The MoE blocks in fewer launches (2026-12-05, eval/results/fused_moe_h200/): the router's choice of experts and
# Qwen3-Next's gated shared-expert sum in one launch each, the experts' pairs summed in one. GPU tests first; the
# 2.25B Qwen3-Next-style MoE's e2e before (scratch/base_pkg: the checkout before, carried) and after; MiniMax and
# Granite 4 after; then, beside every hybrid GPU test, a trained MoE hybrid (tools/train.py's qwen3_next small_moe,
# trained here) through the GPU kernels, the model kept for the CPU reference's run elsewhere. Results under $1.
#   first, here: python3 tools/train_data_subset.py --data-dir ../shared/data --out .devdata_subset --fraction 0.08
#   run: bash tools/device_kernels.sh 540 device_fused_moe_job.sh   (carry .devdata_subset and scratch/base_pkg)
# FOLLOWUP=1 (no carry): what that run left, ~5 minutes: the mended fused-MoE GPU tests, Granite 4's e2e with its
# router fused on transformers 5.17 (its forward's output order learned), the Qwen3-Next-style MoE's B = 1 step
# profiled kernel by kernel after the change, and the routers alone against transformers' (tools/bench_moe_router.py):
#   FOLLOWUP=1 bash tools/device_kernels.sh 480 device_fused_moe_job.sh
set -u
. tools/device_job_env.sh "$@"
if [ -n "${FOLLOWUP:-}" ]; then
  timeout 150 python3 -m pytest -v -rfs --tb=short tests/test_fused_moe.py > "$W/gpu_tests_fused_moe.log" 2>&1
  log "fused moe tests rc $?"
  E2E_TIMEOUT=150 hybrid_e2e granitemoehybrid ""
  python3 tools/family_configs.py qwen3_next --moe > "$W/moe_fields.json"
  BATCH=1 TOP=60 timeout 200 python3 tools/profile_hybrid_decode.py "$W/profile_moe_b1.json" "$W/moe_fields.json" \
    > "$W/profile_moe_b1.log" 2>&1
  log "profile rc $?"
  timeout 200 python3 tools/bench_moe_router.py "$W/moe_router.json" > "$W/moe_router.log" 2>&1
  log "router bench rc $?"
  touch "$W/job.done"
  exit 0
fi
timeout 200 python3 -m pytest -v -rfs --tb=short tests/test_fused_moe.py tests/test_moe_experts.py \
  > "$W/gpu_tests_moe.log" 2>&1
log "moe tests rc $?"
QWEN_MOE=$(python3 tools/family_configs.py qwen3_next --moe)
E2E_TIMEOUT=220 hybrid_e2e qwen3_next _moe_base "$QWEN_MOE"
E2E_TIMEOUT=220 hybrid_e2e qwen3_next _moe "$QWEN_MOE"
E2E_TIMEOUT=160 hybrid_e2e minimax ""
E2E_TIMEOUT=200 hybrid_e2e granitemoehybrid ""
M="$W/qwen3next-moe-small"
(timeout 300 python3 tools/train.py model --arch qwen3_next --size small_moe --seq-len 256 --batch 16 --steps 600 \
  --data-dir .devdata_subset --tokenizer laquant/assets/gla-small --out "$M" > "$W/train.log" 2>&1
 log "train rc $?"
 timeout 400 python3 tools/ablation.py "$M" --device cuda --context 256 --samples 64 --seq-len 256 \
   --max-tokens 16384 --recipes hybrid_int8 --quiet --out "$W/ablation_moe_cuda" > "$W/ablation_moe_cuda.log" 2>&1
 log "cuda ablation rc $?"
 touch "$W/ablations.done") &
timeout 420 python3 -m pytest -v -rfs --tb=short -m gpu tests/test_hybrid.py tests/test_static_hybrid.py \
  tests/test_graphed_step.py tests/test_generate.py > "$W/gpu_tests_families.log" 2>&1
log "family gpu tests rc $?"
while [ ! -f "$W/ablations.done" ]; do sleep 5; done
touch "$W/job.done"
