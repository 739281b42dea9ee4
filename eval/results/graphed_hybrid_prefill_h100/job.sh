#!/usr/bin/env bash
# What the sessions of 2026-12-05 built without a GPU, and what the fused-MoE run left (~25 minutes, no carry: three polls; the later parts may not fit a session's device time):
#   bash tools/device_kernels.sh 540 device_graphed_hybrid_prefill_job.sh   (then poll with the same command)
# 1. GPU tests: the hybrids' graphed prefill (laquant/serving/graphed_hybrid_prefill.py, never captured yet), the int8
#    experts (one token: a block a pair, no alignment launch; its CUDA-graph replay), the fused MoE blocks (the tests
#    mended after the last GPU run: ties as sets, the router's output order learned), the prompt's short conv in one
#    launch, the gated attention's prompt kernel; after the dense qwen3_next's e2e rows, every model's GPU tests (the
#    prompt paths changed); after the MoE's e2e rows, the conv against the PyTorch path it replaces
#    (tools/bench_short_conv.py). Correctness and the headline hybrid first: a session's device time may end early.
# 2. e2e (`laquant eval speed`, prompt 1,024, B = 1 and 64): the dense 1.14B qwen3_next (the graphed prefill beside
#    the eager one), the 2.25B Qwen3-Next-style MoE (B = 1 without the alignment launch; its prefill replayed as a
#    graph, `prefill_graphed_tok_per_s`), Granite 4 (its router fused on transformers 5.17 since the order is learned).
# 3. The Qwen3-Next-style MoE's B = 1 step kernel by kernel, and the routers alone against transformers'
#    (tools/bench_moe_router.py).
# 4. The decode GEMMs beside the fastest pure read of their weights (tools/read_floor_probe.py): how far a call of
#    4-46 MB can get from copy bandwidth at all, the 1.37B GLA's shapes and the 7B ones.
# 5. Last (it may not finish in the device time left): the int8 experts at prefill sizes, every tile of the sweep's
#    grid against the rule's (tools/bench_moe_experts.py --sweep --sweep-prefill), and the experts with T = 1 now
#    without the alignment launch against transformers' bf16 ones.
set -u
. tools/device_job_env.sh "$@"
timeout 420 python3 -m pytest -v -rfs --tb=short tests/test_graphed_hybrid_prefill.py tests/test_moe_experts.py \
  tests/test_fused_moe.py tests/test_short_conv.py tests/test_gated_attention.py tests/test_delta_kernels.py \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
# the delta rule's decode kernel with its sums as FMAs (this tree) against the checkout before (scratch/base_pkg, if
# carried): B = 64, qwen3_next's 32 heads of 128 x 128, streamed from 24 pools, one after the other
timeout 150 python3 tools/probe_decode_prefetch.py "$W/delta_fma.json" --kernel delta --launches 16x1 --skip-step \
  > "$W/delta_fma.log" 2>&1
log "delta probe rc $?"
if have_base; then
  PYTHONPATH="$BASE:$PYTHONPATH" timeout 150 python3 tools/probe_decode_prefetch.py "$W/delta_fma_base.json" \
    --kernel delta --launches 16x1 --skip-step > "$W/delta_fma_base.log" 2>&1
  log "delta probe base rc $?"
fi
E2E_TIMEOUT=200 hybrid_e2e qwen3_next ""
# the models on the changed prompt paths (short convs, gated attention) and graphs, every family
timeout 420 python3 -m pytest -v -rfs --tb=short -m gpu tests/test_hybrid.py tests/test_static_hybrid.py \
  tests/test_graphed_step.py tests/test_generate.py tests/test_graphed_prefill.py > "$W/gpu_tests_models.log" 2>&1
log "model gpu tests rc $?"
QWEN_MOE=$(python3 tools/family_configs.py qwen3_next --moe)
E2E_TIMEOUT=240 hybrid_e2e qwen3_next _moe "$QWEN_MOE"
timeout 120 python3 tools/bench_short_conv.py --out "$W/short_conv" > "$W/short_conv.log" 2>&1
log "short conv bench rc $?"
E2E_TIMEOUT=200 hybrid_e2e granitemoehybrid ""
echo "$QWEN_MOE" > "$W/moe_fields.json"
BATCH=1 TOP=60 timeout 200 python3 tools/profile_hybrid_decode.py "$W/profile_moe_b1.json" "$W/moe_fields.json" \
  > "$W/profile_moe_b1.log" 2>&1
log "profile rc $?"
timeout 200 python3 tools/bench_moe_router.py "$W/moe_router.json" > "$W/moe_router.log" 2>&1
log "router bench rc $?"
for shapes in gla 7b; do
  timeout 150 python3 tools/read_floor_probe.py --out "$W/read_floor_$shapes" --shapes $shapes \
    > "$W/read_floor_$shapes.log" 2>&1
  log "read floor $shapes rc $?"
done
timeout 300 python3 tools/bench_moe_experts.py "$W/moe_experts_sweep.json" --sweep --sweep-prefill \
  > "$W/moe_experts_sweep.log" 2>&1
log "moe experts sweep rc $?"
touch "$W/job.done"
