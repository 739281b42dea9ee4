"""Launch parameters of the delta-rule / KDA prefill walk for one long sequence (few programs: B * H < SMs), where the
walk's serial steps bound it: block_v (V columns a program owns), num_warps and num_stages at block_t 16, bf16,
H = 32 heads of K = V = 128, CUDA-event medians; one JSON line per rule, shape and launch.

    python tools/sweep_walk.py [--rules delta,kda] [--shape 1x16384]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from bench_kda_prefill import inputs, median_ms

from laquant.kernels.delta.chunk import chunk_delta_triton
from laquant.kernels.kda.chunk import chunk_kda_triton


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rules", default="delta,kda")
    ap.add_argument("--shape", default="1x16384")
    args = ap.parse_args()
    B, T = (int(x) for x in args.shape.split("x"))
    H, K = 32, 128
    for rule in args.rules.split(","):
        kernel = chunk_kda_triton if rule == "kda" else chunk_delta_triton
        q, k, v, g, beta = inputs(B, T, H, K, K)
        if rule == "delta":
            g = g[..., 0].contiguous()
        with torch.no_grad():
            ref, _ = kernel(q.float(), k.float(), v.float(), g, beta, use_qk_l2norm=True)
            for bv, warps, stages in itertools.product((16, 32, 64), (2, 4), (1, 2)):
                row = dict(rule=rule, device=torch.cuda.get_device_name(), B=B, T=T, H=H, block_v=bv,
                           num_warps=warps, num_stages=stages)
                run = lambda: kernel(q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True,  # noqa: E731
                                     block_v=bv, num_warps=warps, num_stages=stages)  # noqa: B023
                try:
                    row["ms"] = median_ms(run, reps=10)
                    o, _ = run()
                    row["rel_err_vs_fp32"] = ((o.float() - ref).norm() / ref.norm()).item()
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
