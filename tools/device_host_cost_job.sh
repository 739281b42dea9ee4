#!/usr/bin/env bash
# Issue #14's host-bound eager paths: one launch's host cost piece by piece (tools/launch_cost.py) and where the host
# time of an eager forward goes (tools/profile_host.py: cProfile of the 1.37B GLA's eager decode steps and 1K prefill,
# bf16 and gla_int8_all).
#   run: bash tools/device_kernels.sh 400 device_host_cost_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 200 python3 tools/launch_cost.py "$W/launch_cost.json" > "$W/launch_cost.log" 2>&1
log "launch cost rc $?"
mkdir -p "$W/host_profile"
(cd tools && timeout 300 python3 profile_host.py "$W/host_profile") > "$W/host_profile.log" 2>&1
log "host profile rc $?"
touch "$W/job.done"
