#!/usr/bin/env bash
# The latent attention kernel's launch at Kimi Linear's shape (tools/bench_latent_attention.py): split counts and
# position blocks, against the PyTorch ops it replaced.   run: bash tools/device_kernels.sh 200 device_latent_sweep_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 170 python3 tools/bench_latent_attention.py "$W/bench_latent_attention.json" --splits 1 2 3 4 5 6 8 12 \
  --blocks 16 32 64 > "$W/bench_latent_attention.log" 2>&1
log "bench rc $?"
touch "$W/job.done"
