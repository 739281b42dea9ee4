#!/usr/bin/env bash
# Kimi Linear (issue #14, model coverage): KDA's chunked prefill in two launches and MLA's absorbed static decode
# step. The kimi_linear e2e (tools/family_configs.py) first, then GPU tests (KDA prefill, the GLA decode kernel in
# both modes, the hybrids' graphed steps), then the chunk-size sweep against fla's chunk_kda.
#   run: bash tools/device_kernels.sh 540 device_kda_prefill_job.sh   (carry .whl: fla is the peer)
set -u
. tools/device_job_env.sh "$@"
timeout 330 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "kimi_linear:$(python3 tools/family_configs.py kimi_linear)" --out "$W/e2e_kimi_linear" \
  > "$W/e2e_kimi_linear.log" 2>&1
log "kimi e2e rc $?"
timeout 240 python3 -m pytest -q tests/test_kda_kernels.py tests/test_decode_kernel.py tests/test_static_hybrid.py \
  -k "prefill or launch or formats or roundtrip or varlen or model_sized or test_decode_kernel or kimi" \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 200 python3 tools/bench_kda_prefill.py --block-t 16,32 > "$W/bench_kda_prefill.jsonl" \
  2> "$W/bench_kda_prefill.err"
log "bench rc $?"
touch "$W/job.done"
