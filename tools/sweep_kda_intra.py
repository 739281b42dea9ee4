"""Launch sweep of KDA's intra-chunk kernel (chunk size, sub-block rows, warps), Kimi's heads, bf16, CUDA-event
medians; with ``--before MODULE`` (a copy of an earlier ``kernels/kda/chunk.py``) its kernel is timed beside.
One JSON line per launch.

    python tools/sweep_kda_intra.py [--shape 64x1024] [--before scratch.kda_chunk_before]
"""

from __future__ import annotations

import argparse
import importlib
import json

import torch
import triton
from bench_kda_prefill import inputs, median_ms

from laquant.kernels.kda import chunk as kda_chunk


# (chunk, sub-block rows, warps); the first sweep (sub-blocks of 2, 4 and 8 rows, 2-8 warps, chunks 16 and 32) had
# 8 of 16 rows and 2 warps fastest, chunk 32 3-8x slower
SWEEP = [(16, 8, 1), (16, 8, 2), (16, 16, 1), (16, 16, 2), (16, 16, 4), (32, 16, 2), (32, 16, 4), (32, 32, 2),
         (64, 32, 4)]


def launch(module, q, k, v, g, beta, outs, BT, warps, **sub):
    B, T, H, K = q.shape
    V = v.shape[-1]
    qk, w, u = outs
    module._kda_intra_chunk_kernel[(triton.cdiv(T, BT), B * H)](
        q, k, v, g, beta, qk, w, u, qk, qk, q.stride(0), q.stride(1), q.stride(2), k.stride(0),
        k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1),
        g.stride(2), g.stride(3), beta.stride(0), beta.stride(1), beta.stride(2), T, K ** -0.5,
        H=H, GROUP=1, K=K, V=V, BT=BT, BK=K, BV=V, VARLEN=False, LOW_PRECISION=True, L2NORM=True,
        num_warps=warps, **sub)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="64x1024")
    ap.add_argument("--before", default=None, help="module holding an earlier _kda_intra_chunk_kernel (BKS=8)")
    args = ap.parse_args()
    B, T = (int(x) for x in args.shape.split("x"))
    H, K, V = 32, 128, 128
    q, k, v, g, beta = inputs(B, T, H, K, V)
    runs = [("before", importlib.import_module(args.before), 16, 2, {"BKS": 8})] if args.before else []
    for BT, sb, warps in SWEEP:
        runs.append(("sub_block", kda_chunk, BT, warps, {"SB": sb}))
    refs = {}
    for name, module, BT, warps, sub in runs:
        outs = [torch.empty(B, T, H, n, dtype=torch.bfloat16, device="cuda") for n in (BT, K, V)]
        if BT not in refs:
            refs[BT] = kda_chunk.kda_intra_chunk(q.float(), k.float(), v.float(), g, beta, None, None, True, BT)
        row = {"device": torch.cuda.get_device_name(), "kernel": name, "B": B, "T": T, "H": H, "BT": BT,
               "warps": warps, **sub}
        try:
            ms = median_ms(lambda: launch(module, q, k, v, g, beta, outs, BT, warps, **sub))
            row.update(ms=ms, **{f"rel_err_{n}": ((a.float() - r).norm() / r.norm()).item()
                                 for n, a, r in zip(("qk", "w", "u"), outs, refs[BT])})
        except Exception as e:  # noqa: BLE001
            row["error"] = str(e)[:300]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
