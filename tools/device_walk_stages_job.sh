#!/usr/bin/env bash
# The prefill walk with num_stages 1 and 2 (the next chunk's loads pipelined) at the default block_v, batched and
# long single-sequence shapes, the delta rule and KDA.
#   run: bash tools/device_kernels.sh 200 device_walk_stages_job.sh
set -u
. tools/device_job_env.sh "$@"
export PYTHONPATH=$PYTHONPATH:$PWD/tools
timeout 180 python3 - > "$W/walk_stages.jsonl" 2> "$W/walk_stages.err" <<'PY'
import json, torch
from bench_kda_prefill import inputs, median_ms
from laquant.kernels.delta.chunk import chunk_delta_triton
from laquant.kernels.kda.chunk import chunk_kda_triton
for rule, kernel in (("delta", chunk_delta_triton), ("kda", chunk_kda_triton)):
    for B, T in ((64, 1024), (4, 16384), (1, 65536), (1, 4096)):
        q, k, v, g, beta = inputs(B, T, 32, 128, 128)
        if rule == "delta":
            g = g[..., 0].contiguous()
        row = dict(rule=rule, device=torch.cuda.get_device_name(), B=B, T=T, H=32)
        with torch.no_grad():
            outs = []
            for stages in (1, 2):
                run = lambda: kernel(q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True, num_stages=stages)
                row[f"stages{stages}_ms"] = median_ms(run, reps=10)
                outs.append(run()[0])
            row["same_output"] = bool(torch.equal(outs[0], outs[1]))
        print(json.dumps(row), flush=True)
        del q, k, v, g, beta
        torch.cuda.empty_cache()
PY
log "stages rc $?"
touch "$W/job.done"
