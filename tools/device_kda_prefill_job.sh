#!/usr/bin/env bash
# Kimi Linear prefill (issue #14, model coverage): KDA's chunked prefill in two launches. GPU tests of the KDA and
# delta-rule kernels and of the GLA decode kernel (both modes), the chunk-size sweep against fla's chunk_kda, and the
# kimi_linear e2e (tools/family_configs.py).
#   run: bash tools/device_kernels.sh 540 device_kda_prefill_job.sh   (carry .whl: fla is the peer)
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -q tests/test_kda_kernels.py tests/test_decode_kernel.py \
  "tests/test_delta_kernels.py" -k "not decode or test_decode_kernel" > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
timeout 200 python3 tools/bench_kda_prefill.py --shapes 1x1024,64x1024,4x16384,1x65536 > "$W/bench_kda_prefill.jsonl" \
  2> "$W/bench_kda_prefill.err"
log "bench rc $?"
timeout 300 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "kimi_linear:$(python3 tools/family_configs.py kimi_linear)" --out "$W/e2e_kimi_linear" \
  > "$W/e2e_kimi_linear.log" 2>&1
log "kimi e2e rc $?"
touch "$W/job.done"
