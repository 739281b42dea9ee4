#!/usr/bin/env bash
# Poll device_long_context_job.sh (started by device_kernels.sh): wait up to $1 s for job.done, print
# the status and each log's last lines (progress bars dropped), pack the work folder into $OUT.
W=/tmp/laqk-${JOB:-device_long_context_job}
T=${1:-500}
t=0
while [ ! -f "$W/job.done" ] && [ $t -lt "$T" ]; do sleep 10; t=$((t+10)); done
cat "$W/status.log"
for f in "$W"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v "it/s\]\|tok/s\]\|win/s\]\|s/it\]" | tail -n 3; done 2>/dev/null | tail -n 60
(cd "$W" && tar czf - --exclude='*.done' --exclude='*.started' .) | split -b 15M - "$OUT/results.tgz.part-"
[ -f "$W/job.done" ] && echo "JOB DONE" || echo "JOB RUNNING"
