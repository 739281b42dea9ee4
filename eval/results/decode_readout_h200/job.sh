#!/usr/bin/env bash
# Issue #14: the decode kernels summing q S block by block (no [BLOCK_K, V] accumulator): GPU tests, the kernels
# alone against the checkout before (scratch/base_pkg, carried), alternated, then the GLA e2e of both.
#   run: bash tools/device_kernels.sh 400 device_readout_job.sh   (carry scratch/base_pkg)
set -u
. tools/device_job_env.sh "$@"
for rep in 1 2; do
  PYTHONPATH="$BASE:tools:.:${PYTHONPATH:-}" timeout 100 python3 tools/decode_step_probe.py "$W/base$rep.json" \
    > "$W/base$rep.log" 2>&1
  log "probe base $rep rc $?"
  PYTHONPATH="tools:.:${PYTHONPATH:-}" timeout 100 python3 tools/decode_step_probe.py "$W/new$rep.json" \
    > "$W/new$rep.log" 2>&1
  log "probe new $rep rc $?"
done
timeout 150 python3 -m pytest -q tests/test_decode_kernel.py > "$W/gpu_tests_gla.log" 2>&1
log "gla decode tests rc $?"
timeout 150 python3 -m pytest -q tests/test_delta_kernels.py tests/test_kda_kernels.py -k decode \
  > "$W/gpu_tests_delta.log" 2>&1
log "delta/kda decode tests rc $?"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
for tag in _new _base; do
  path="$PYTHONPATH"; [ "$tag" = _base ] && path="$BASE:$PYTHONPATH"
  PYTHONPATH="$path" timeout 150 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 1024 \
    --gen 32 --no-profile --model 'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}' \
    --out "$W/e2e_gla$tag" > "$W/e2e_gla$tag.log" 2>&1
  log "e2e gla$tag rc $?"
done
touch "$W/job.done"
