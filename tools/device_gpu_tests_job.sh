#!/usr/bin/env bash
# Every test marked gpu, on the GPU (the fla parity tests skip without the fla wheels). After a change to a path every
# family runs, such as the short conv's decode kernel. Results under $1.   run: bash tools/device_kernels.sh 560 device_gpu_tests_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 1500 python3 -m pytest -q -rfs --tb=short -m gpu -p no:cacheprovider --durations=10 tests > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
