#!/usr/bin/env bash
# GPU verification after a change to the kernels or the model path (device_kernels.sh WAIT
# device_verify_job.sh; carry the fla wheels): the whole test suite on the GPU (every Triton kernel
# against its reference at model sizes, the models and hybrids on the kernels, fla parity, and the
# CPU tests), then a quick run of the state kernels' speed suites (decode, prefill, delta_decode,
# delta_prefill) against fla.
W=$1
set -x
python3 -m pytest -q -p no:cacheprovider -rs --durations=15 tests > "$W/all_tests.log" 2>&1
python3 -m laquant.cli eval speed --quick --suite decode prefill delta_decode delta_prefill --out "$W/speed_quick" \
  > "$W/speed_quick.log" 2>&1
touch "$W/job.done"
