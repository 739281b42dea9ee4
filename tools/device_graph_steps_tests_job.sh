#!/usr/bin/env bash
# GPU tests of transformers' generate with graph steps (laquant's GLA and the hybrids) and of laquant.generate's
# graphed loop (inference mode included).
. tools/device_job_env.sh "$@"
timeout 500 python3 -m pytest -v -rfs --tb=short -m gpu tests/test_graphed_step.py ${MORE_TESTS-tests/test_generate.py} \
  > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
