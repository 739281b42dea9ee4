#!/usr/bin/env bash
# Issue #14 / #19, second run: PDL at every launch of <= 256 tokens (PDL_MAX_ROWS), the GEMM and decode kernels
# releasing the next kernel after their loop: the 1.37B GLA e2e (this tree, and the checkout before the session,
# scratch/base_pkg: *_base) and the 1.14B qwen3_next e2e (this tree). First, why `laquant eval serve --draft ngram`
# ran its speculative rounds eagerly (the capture's first error is now in the warning): a small replay with the
# layer gate's side stream on, then off.
#   run: bash tools/device_kernels.sh 560 device_pdl256_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
BASE="$PWD/scratch/base_pkg"
SERVE="--recipe gla_int8 --system 4096 --user 64 --reply 32 --conversations 2 --turns 2 --block-size 256 --reps 2
  --device cuda --no-accuracy --draft ngram --draft-tokens 8 --quiet"
timeout 240 python3 -m laquant.cli eval serve $SERVE --out "$W/serve_dbg" > "$W/serve_dbg.log" 2>&1
log "serve dbg rc $?"
LAQUANT_SIDE_STREAM=0 timeout 240 python3 -m laquant.cli eval serve $SERVE --out "$W/serve_dbg_nobranch" \
  > "$W/serve_dbg_nobranch.log" 2>&1
log "serve dbg no branch rc $?"
bash tools/device_gla_e2e.sh "$W"
PYTHONPATH="$BASE:$PYTHONPATH" E2E_TAG=_base bash tools/device_gla_e2e.sh "$W"
bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
