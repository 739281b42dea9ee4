#!/usr/bin/env bash
# Issue #19: why `laquant eval serve --draft ngram` ran its speculative rounds eagerly on the GPU (the capture
# refused: a host copy / a sync inside the captured round): the replay with every capture failure's first error
# printed with its traceback. Then issue #14's PDL modes (release at the start up to 16 tokens, after the main
# loop above): the GPU tests of the kernels that take them and the 1.37B GLA e2e.
#   run: bash tools/device_kernels.sh 560 device_serve_capture_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 - > "$W/serve_capture.log" 2>&1 <<'PY'
import traceback
import laquant.generate as G
captured = G.capture_graph
def capture_graph(fn):
    try:
        return captured(fn)
    except BaseException as exc:
        traceback.print_exception(exc.__context__ if exc.__context__ is not None else exc)
        raise
G.capture_graph = capture_graph
from laquant.cli import main
main(["eval", "serve", "--recipe", "gla_int8", "--system", "4096", "--user", "64", "--reply", "32",
      "--conversations", "1", "--turns", "2", "--block-size", "256", "--reps", "1", "--device", "cuda",
      "--no-accuracy", "--draft", "ngram", "--draft-tokens", "8", "--quiet", "--out", "/tmp/serve_capture"])
PY
log "serve capture rc $?"
timeout 240 python3 -m pytest -q -rfs --tb=short tests/test_int8_gemm_kernel.py tests/test_decode_kernel.py \
  tests/test_pdl.py > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
bash tools/device_gla_e2e.sh "$W"
touch "$W/job.done"
