#!/usr/bin/env bash
# Ran on 2026-12-06 (eval/results/gpu_check_h100/); its MiniMax step now selects nothing (MiniMax is among the
# graphed prefill's GPU cases since), the follow-up is tools/device_minimax_prefill_job.sh.
# What the session of 2026-12-05 (sixteenth) built after its one GPU run, and what that run (eval/results/
# graphed_hybrid_prefill_h100/) left undone, run in this order (~25 minutes, three polls):
#   bash tools/device_kernels.sh 540 device_conv_runs_job.sh     (carry scratch/base_pkg: for 3., commit e832aaf, the
#   tree before the short conv's runs, built as device_job_env.sh's private_pkg builds one, its assets left out)
# 1. Why MiniMax's graphed prefill failed its GPU test (refused since): the test with the refusal lifted, its traceback.
# 2. The prompt short conv reading qwen3_next's gathered columns as runs (vectorized loads), against the PyTorch path
#    (tools/bench_short_conv.py: qwen3_next's own columns, and scattered ones): scattered columns ran at 203-234 GB/s
#    on the H100, contiguous channels at 1.9-2.5 TB/s; qwen3_next's own columns were never timed.
# 3. e2e of the dense qwen3_next, this tree and the checkout before (scratch/base_pkg): the prefill with the faster conv.
# 4. The GPU tests the last run's time limit cut (the delta kernels' rest, the verify kernels), compile check included,
#    and the fused MoE's (the seventeenth session's shared sum over the int8 experts' pairs among them).
#    Then the model GPU tests that cross the seventeenth session's last norm and rotary cos / sin in one launch, and the
#    rotary kernel's own.
# 5. e2e of the Qwen3-Next-style MoE, this tree and the same checkout before (its MoE layers one launch fewer since
#    the seventeenth session, and the conv's runs).
# 6. The last job's leftovers: Granite 4's e2e, the MoE's B = 1 profile, the router bench, the read-floor probe.
# Order (eighteenth session, the first with a GPU since): 4.'s model and kernel GPU tests first (the seventeenth
# session's last norm, rotary and MoE sum had never run on a GPU), the read-floor probe on the GLA's shapes (the
# GEMM target's yardstick), then 3., 5., 1., 2., the delta / verify tests, 6.
set -u
. tools/device_job_env.sh "$@"
timeout 360 python3 -m pytest -v -rfs --tb=short -m gpu tests/test_fused_rotary.py tests/test_fused_moe.py \
  tests/test_quantizing_rowwise.py tests/test_launch.py tests/test_static_hybrid.py tests/test_gated_attention.py \
  tests/test_graphed_hybrid_prefill.py -k "not unverified" > "$W/gpu_tests_models.log" 2>&1
log "model gpu tests rc $?"
timeout 150 python3 tools/read_floor_probe.py --out "$W/read_floor_gla" --shapes gla > "$W/read_floor_gla.log" 2>&1
log "read floor gla rc $?"
E2E_TIMEOUT=200 hybrid_e2e qwen3_next ""
E2E_TIMEOUT=200 hybrid_e2e qwen3_next _base
python3 tools/family_configs.py qwen3_next --moe > "$W/moe_fields.json"
E2E_TIMEOUT=240 hybrid_e2e qwen3_next _moe "$(cat "$W/moe_fields.json")"
E2E_TIMEOUT=240 hybrid_e2e qwen3_next _moe_base "$(cat "$W/moe_fields.json")"
timeout 180 python3 -m pytest -v -rfsxX --tb=long --runxfail -m gpu -k unverified tests/test_graphed_hybrid_prefill.py \
  > "$W/minimax_prefill.log" 2>&1
log "minimax prefill test rc $?"
timeout 120 python3 tools/bench_short_conv.py --out "$W/short_conv" > "$W/short_conv.log" 2>&1
log "short conv bench rc $?"
timeout 420 python3 -m pytest -v -rfs --tb=short tests/test_delta_kernels.py tests/test_verify.py \
  tests/test_compile_offline.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
E2E_TIMEOUT=200 hybrid_e2e granitemoehybrid ""
BATCH=1 TOP=60 timeout 200 python3 tools/profile_hybrid_decode.py "$W/profile_moe_b1.json" "$W/moe_fields.json" \
  > "$W/profile_moe_b1.log" 2>&1
log "profile rc $?"
timeout 200 python3 tools/bench_moe_router.py "$W/moe_router.json" > "$W/moe_router.log" 2>&1
log "router bench rc $?"
timeout 150 python3 tools/read_floor_probe.py --out "$W/read_floor_7b" --shapes 7b > "$W/read_floor_7b.log" 2>&1
log "read floor 7b rc $?"
touch "$W/job.done"
