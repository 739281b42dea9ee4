#!/usr/bin/env bash
# Issue #14 on an H100: the H100's decode GEMM table (configs.TABLES['NVIDIA H100 80GB HBM3']) dates from the first
# sweeps (2026-11-24/27: 4 warps, 4 stages, no 16-column tiles, the kernel of then); the H200's is a --wide sweep.
# Steps: the 1.37B GLA's e2e and the dense qwen3_next's on the committed table ("_before"); the --wide sweep of the
# default shapes at every bucket (tools/sweep_gemm.py; it also times each committed entry) and its table applied;
# both e2e again on it ("_after", this tree's package copied with the new table: a poll re-copies the tree); the GEMM
# GPU tests on it. Results under $1 (sweep/configs.py: the table to commit).
#   bash tools/device_kernels.sh 560 device_h100_sweep_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
E2E_TAG=_before bash tools/device_gla_e2e.sh "$W" 1b
hybrid_e2e qwen3_next _before
mkdir -p "$W/sweep"
for i in 0 1 2 3 4 5 6 7 8 9 10 11; do python3 tools/sweep_gemm.py --wide --warm $i/12 > "$W/sweep/warm_$i.log" 2>&1 & done
wait
log "sweep warm done"
timeout 900 python3 tools/sweep_gemm.py --wide --out "$W/sweep" > "$W/sweep/sweep.log" 2>&1
log "sweep rc $?"
cp kernels/gemm/configs.py "$W/configs_committed.py"
python3 tools/sweep_gemm.py --apply "$W/sweep/configs_table.py" && cp kernels/gemm/configs.py "$W/sweep/configs.py"
log "apply rc $?"
private_pkg "$W/pkg"
cp "$W/configs_committed.py" kernels/gemm/configs.py
PYTHONPATH="$W/pkg:$PYTHONPATH" E2E_TAG=_after bash tools/device_gla_e2e.sh "$W" 1b
PYTHONPATH="$W/pkg:$PYTHONPATH" hybrid_e2e qwen3_next _after
PYTHONPATH="$W/pkg:$PYTHONPATH" timeout 300 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider \
  tests/test_gemm_decode.py tests/test_int8_gemm_kernel.py > "$W/gpu_tests_gemm.log" 2>&1
log "gemm tests rc $?"
rm -rf "$W/pkg"
touch "$W/job.done"
