#!/usr/bin/env bash
# The codes producers timed alone (tools/bench_codes_producers.py), one definition for the device jobs that A/B them:
# this tree (codes_new.json, bench_new.log) and the checkout carried as scratch/base_pkg, first on PYTHONPATH
# (codes_base.json, bench_base.log). $1: work folder; a line each in $1/status.log.
set -u
W=${1:-$OUT}
BASE="$PWD/scratch/base_pkg"
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
timeout 300 python3 tools/bench_codes_producers.py --out "$W/codes_new.json" --label new > "$W/bench_new.log" 2>&1
log "bench new rc $?"
PYTHONPATH="$BASE:$PYTHONPATH" timeout 300 python3 tools/bench_codes_producers.py --out "$W/codes_base.json" --label base \
  > "$W/bench_base.log" 2>&1
log "bench base rc $?"
