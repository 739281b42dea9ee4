#!/usr/bin/env bash
# Host time of eager decode steps and a 1K prefill (tools/profile_host.py), bf16 and gla_int8_all.
. tools/device_job_env.sh "$@"
timeout 500 python3 tools/profile_host.py "$W/host" > "$W/host.log" 2>&1
log "host profile rc $?"
touch "$W/job.done"
