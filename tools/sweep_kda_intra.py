"""Launch sweep of KDA's intra-chunk kernel (channel-slice width BKS, warps) at chunk 16, Kimi's heads, bf16.

    python tools/sweep_kda_intra.py [--shape 64x1024]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
from bench_kda_prefill import inputs, median_ms

from laquant.kernels.kda import chunk as kda_chunk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="64x1024")
    args = ap.parse_args()
    B, T = (int(x) for x in args.shape.split("x"))
    H, K, V, BT = 32, 128, 128, 16
    q, k, v, g, beta = inputs(B, T, H, K, V)
    qk, w, u = (torch.empty(B, T, H, n, dtype=torch.bfloat16, device="cuda") for n in (BT, K, V))
    ref = kda_chunk.kda_intra_chunk(q, k, v, g, beta, None, None, True, BT)
    for bks in (8, 16, 32):
        for warps in (1, 2, 4, 8):
            def run():
                kda_chunk._kda_intra_chunk_kernel[(triton.cdiv(T, BT), B * H)](
                    q, k, v, g, beta, qk, w, u, qk, qk, q.stride(0), q.stride(1), q.stride(2), k.stride(0),
                    k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1),
                    g.stride(2), g.stride(3), beta.stride(0), beta.stride(1), beta.stride(2), T, K ** -0.5,
                    H=H, GROUP=1, K=K, V=V, BT=BT, BK=K, BKS=bks, BV=V, VARLEN=False, LOW_PRECISION=True,
                    L2NORM=True, num_warps=warps)
            try:
                ms = median_ms(run)
                same = all(torch.allclose(a.float(), r.float(), atol=1e-2, rtol=1e-2) for a, r in zip((qk, w, u), ref))
                print(json.dumps({"B": B, "T": T, "BKS": bks, "warps": warps, "ms": ms, "matches": same}), flush=True)
            except Exception as e:  # noqa: BLE001
                print(json.dumps({"BKS": bks, "warps": warps, "error": str(e)[:200]}), flush=True)


if __name__ == "__main__":
    main()
