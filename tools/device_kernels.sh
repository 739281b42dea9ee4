#!/usr/bin/env bash
# Kernel session on the lent GPU: GPU tests of every kernel and of the model on them, the speed
# suites against fla / SDPA / cuBLAS / bitsandbytes, and the GPU-vs-CPU perplexity check.
# Re-entrant: each call waits up to $1 seconds for the background job ($2, default
# device_kernels_job.sh; device_hybrid_job.sh is the hybrid session's) and packs what exists into
# $OUT/results.tgz.part-* (cat them, then untar). Carry .whl for the jobs that need fla or bitsandbytes (the peers), .devdata to train.
set -u
WAIT=${1:-540}
JOB=${2:-device_kernels_job.sh}
W=/tmp/laqk-${JOB%.sh}
mkdir -p "$W"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_AUTOTUNING=1
if [ ! -f "$W/setup.done" ]; then
  { ! ls .whl/*.whl > /dev/null 2>&1 \
    || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; } \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . \
    && touch "$W/setup.done" || { echo "SETUP FAILED"; exit 1; }
fi
if [ ! -f "$W/job.started" ]; then
  touch "$W/job.started"
  setsid nohup bash tools/"$JOB" "$W" > "$W/job.log" 2>&1 < /dev/null &
fi
t=0
while [ ! -f "$W/job.done" ] && [ $t -lt "$WAIT" ]; do sleep 10; t=$((t + 10)); done
tail -n 5 "$W"/*.log
# split under the 16 MiB a returned file may have (a trained model can be larger)
(cd "$W" && tar czf - --exclude='*.done' --exclude='*.started' --exclude='*.partial-*' .) \
  | split -b 15M - "$OUT/results.tgz.part-"
[ -f "$W/job.done" ] && echo "JOB DONE" || echo "JOB RUNNING"
