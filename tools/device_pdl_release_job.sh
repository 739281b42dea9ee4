#!/usr/bin/env bash
# Issue #14: programmatic dependent launch with the next kernel released after the main loop (the split-K GEMM and
# the GLA / delta-rule decode kernels call gdc_launch_dependents after their loop instead of at their start).
# Steps: GPU tests with PDL on every launch; the 1.37B GLA e2e (this tree and the checkout before, scratch/base_pkg:
# *_base; each with PDL at <= 16 tokens, the default, and on every launch: *_pdlall); the 1.14B qwen3_next e2e (this
# tree, both PDL modes). Then issue #19's unmeasured paths: a model-level speculative round at B = 64 (prompt lookup,
# the 1.37B-shaped gla_int8 target) and `laquant eval serve --draft ngram`.
#   run: bash tools/device_kernels.sh 560 device_pdl_release_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
LAQUANT_PDL=all timeout 400 python3 -m pytest -q -rfs --tb=short tests/test_int8_gemm_kernel.py \
  tests/test_decode_kernel.py tests/test_graphed_step.py tests/test_verify.py > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
bash tools/device_gla_e2e.sh "$W"
LAQUANT_PDL=all E2E_TAG=_pdlall bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" LAQUANT_PDL=all E2E_TAG=_base_pdlall bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
bash tools/device_hybrid_e2e.sh "$W"
LAQUANT_PDL=all E2E_TAG=_pdlall bash tools/device_hybrid_e2e.sh "$W"
timeout 400 python3 tools/bench_verify.py --out "$W/spec_b64" --no-kernels --draft ngram --spec-batch 64 \
  --timing-target '{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16}' > "$W/spec_b64.log" 2>&1
log "spec b64 rc $?"
bash tools/device_serve_ngram.sh "$W" 300
touch "$W/job.done"
