#!/usr/bin/env bash
# The two Mamba2 families first timed on 2026-11-29, Falcon-H1 (1.83B) and Zamba2 (1.2B-style), tools/family_configs.py:
# the GPU tests of their codes paths (Falcon-H1's grouped q/k/v and muP SwiGLU, Zamba2's norms), then the e2e decode
# (bf16 vs hybrid_int8, graphed, B = 1 and 64, prompt 1,024); with scratch/base_pkg present (a checkout carried as
# scratch, first on PYTHONPATH) that checkout too, *_base, in the same job. Carry .whl (eval speed imports fla).
set -u
. tools/device_job_env.sh "$@"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_quantizing_rowwise.py -k "gpu and (zamba2 or falcon_h1)" \
  > "$W/gpu_tests.log" 2>&1
log "tests rc $?"
for fam in falcon_h1 zamba2; do
  hybrid_e2e "$fam" ""
  [ -d "$BASE/laquant" ] && hybrid_e2e "$fam" _base
done
touch "$W/job.done"
