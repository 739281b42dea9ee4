#!/usr/bin/env bash
# Poll a job that tools/device_kernels.sh started (JOB=name without .sh; default
# device_long_context_job): wait up to $1 s for its job.done, print status.log and each log's last
# lines (progress bars dropped), pack its work folder into $OUT. The machine goes back ~30 s after a
# call ends: call this again at once, or the job is lost.
#   bash tools/device_kernels.sh 1 device_gla_large_job.sh; JOB=device_gla_large_job bash tools/device_poll_lc.sh 480
W=/tmp/laqk-${JOB:-device_long_context_job}
T=${1:-500}
t=0
while [ ! -f "$W/job.done" ] && [ $t -lt "$T" ]; do sleep 10; t=$((t+10)); done
cat "$W/status.log"
for f in "$W"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v "it/s\]\|tok/s\]\|win/s\]\|s/it\]" | tail -n 3; done 2>/dev/null | tail -n 60
(cd "$W" && tar czf - --exclude='*.done' --exclude='*.started' .) | split -b 15M - "$OUT/results.tgz.part-"
[ -f "$W/job.done" ] && echo "JOB DONE" || echo "JOB RUNNING"
