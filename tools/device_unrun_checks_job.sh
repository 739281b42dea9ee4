#!/usr/bin/env bash
# Session of 2026-11-29 (evening), first call: the GPU tests of what last session changed after its last device call
# (Falcon-H1's gated norm kernel, the decode attention kernel's review fixes, the static / graphed hybrid steps), then
# Falcon-H1's e2e against the checkout before its gated norm kernel (scratch/base_pkg, first on PYTHONPATH), and the
# graphed B = 64 step of Kimi Linear (the listed family furthest from its bf16) kernel by kernel.
#   run: bash tools/device_kernels.sh 560 device_unrun_checks_job.sh   (carry .whl and scratch)
set -u
. tools/device_job_env.sh "$@"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_decode_attention.py tests/test_static_hybrid.py \
  "tests/test_quantizing_rowwise.py" -k "gpu and (falcon_h1 or decode_attention or graphed or moe or perplexity) or test_decode_attention" \
  > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
hybrid_e2e falcon_h1 ""
[ -d "$BASE/laquant" ] && hybrid_e2e falcon_h1 _base
timeout 200 python3 tools/graph_timeline.py "$W/timeline_kimi_linear.json" --prompt 1024 \
  --model "kimi_linear:$(python3 tools/family_configs.py kimi_linear)" > "$W/timeline_kimi_linear.log" 2>&1
log "kimi timeline rc $?"
touch "$W/job.done"
