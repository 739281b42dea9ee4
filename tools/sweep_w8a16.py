"""Tile sweep of the weight-only (W8A16) split-K GEMM at every decode bucket, for layers with no outlier columns:
the layers ``projections.outlier_fallback: weight_only`` makes (the model runs them W8A16 at every M, so their
tiles matter above the M <= 16 that tools/sweep_gemm.py sweeps W8A16 at). cuBLAS bf16 on the same shape beside it,
weights rotated so that they stream from device memory, CUDA-graph medians (tools/sweep_gemm.py's method).

    python tools/sweep_w8a16.py --shapes 2048x4096,2048x5632 --out DIR
        # writes DIR/w8a16_<device>.{json,md} and DIR/w8a16_table.py
    python tools/sweep_w8a16.py --apply DIR/w8a16_table.py   # those entries' "w8a16" tiles into kernels/gemm/configs.py
                                                               # (their "path" and "w8a8" tiles stay)
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
import triton
from sweep_gemm import STREAM_BYTES, apply, bench, candidates, parse_shapes, rel, render, rotating

from laquant.kernels.gemm.configs import M_BUCKETS
from laquant.kernels.gemm.int8 import PackedOutlierWeight, int8_weight_only_linear_triton

def weights(N, K, copies, dev):
    """``copies`` packed int8 weights ``[N, K]`` with no outlier columns, as the weight-only fallback packs them."""
    gen = torch.Generator(device=dev).manual_seed(N * 7 + K)
    keep = torch.arange(K, device=dev)
    out = []
    for _ in range(copies):
        q = torch.randint(-127, 128, (N, K), device=dev, generator=gen, dtype=torch.int8)
        scale = torch.rand(N, 1, device=dev, generator=gen) * 1e-3 + 1e-4
        none = torch.zeros(0, dtype=torch.long, device=dev)
        out.append(PackedOutlierWeight.pack(q, scale, keep, none, torch.zeros(N, 0, device=dev, dtype=torch.bfloat16),
                                            None, K))
    return out


def tiles(M, N, K):
    """tools/sweep_gemm.py's split-K candidates (4 warps, 4 stages), and each tile of 64 x 64 or more again with 8
    warps and 3 stages (the int8 weight converted in registers is more work per tile than W8A8's)."""
    out = candidates("w8a16", M, N, K)
    return out + [dict(c, num_warps=8, num_stages=3) for c in out if c["BM"] * c["BN"] >= 64 * 64]


def sweep(shapes, buckets, dev):
    rows, table = [], {}
    for N, K in shapes:
        packs = weights(N, K, max(2, math.ceil(STREAM_BYTES / (N * K))), dev)
        wbf = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
               for _ in range(max(2, math.ceil(STREAM_BYTES / (2 * N * K))))]
        dense = packs[0].qweight.float() * packs[0].scale[:, None]
        for M in buckets:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            ref = x.float() @ dense.T
            rec = dict(N=N, K=K, M=M, cublas_bf16_us=bench(rotating(lambda w: F.linear(x, w), wbf)))  # noqa: B023
            best, rejected = None, []
            for c in tiles(M, N, K):
                try:
                    err = rel(int8_weight_only_linear_triton(x, packs[0], c).clone(), ref)
                    if not err < 2e-2:
                        rejected.append(f"{c}: {err}")
                        continue
                    us = bench(rotating(lambda p: int8_weight_only_linear_triton(x, p, c), packs))  # noqa: B023
                except Exception as e:  # noqa: BLE001
                    rejected.append(f"{c}: {type(e).__name__}")
                    continue
                if best is None or us < best[0]:
                    best = (us, c, err)
            rec["w8a16_us"], rec["w8a16_config"], rec["w8a16_rel_err"] = best
            rec["w8a16_vs_cublas"] = rec["cublas_bf16_us"] / rec["w8a16_us"]
            rec["w8a16_GBps"] = (N * K + 4 * N + 2 * M * (K + N)) / rec["w8a16_us"] / 1e3
            rec["rejected"] = rejected
            table[f"{M}@{N}x{K}"] = rec["w8a16_config"]
            rows.append(rec)
            print(f"N={N} K={K} M={M}: cublas {rec['cublas_bf16_us']:.2f} us, w8a16 {rec['w8a16_us']:.2f} us "
                  f"({rec['w8a16_vs_cublas']:.2f}x) {rec['w8a16_config']}", flush=True)
        del packs, wbf
    return rows, table


def _w8a16_tiles(committed: dict, swept: dict) -> dict:
    """The committed entries with the swept ones' W8A16 tiles (their path and W8A8 tiles stay); a swept entry the
    table lacks is refused: it would have no W8A8 tiles."""
    missing = sorted(set(swept) - set(committed))
    if missing:
        raise SystemExit(f"no committed entries for {', '.join(missing)}: run tools/sweep_gemm.py on those shapes")
    return {key: ({**entry, "w8a16": swept[key]} if key in swept else entry) for key, entry in committed.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--apply", default=None)
    ap.add_argument("--shapes", default="2048x4096,2048x5632", help="N x K weights: NxK,NxK,...")
    ap.add_argument("--m", default=",".join(map(str, M_BUCKETS)), help="M buckets, comma-separated")
    args = ap.parse_args()
    if args.apply:
        return apply(args.apply, merge=_w8a16_tiles)
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    slug = "h200" if "H200" in name else "h100" if "H100" in name else name.lower().replace(" ", "_")
    buckets = [int(m) for m in args.m.split(",")]
    rows, table = sweep(parse_shapes(args.shapes), buckets, dev)
    meta = dict(device=name, torch=torch.__version__, triton=triton.__version__, x_dtype="bfloat16", outliers=0,
                timing="do_bench_cudagraph(rep=5) median; weights rotated over > 160 MB of copies")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"w8a16_{slug}.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    with open(os.path.join(args.out, "w8a16_table.py"), "w") as f:
        f.write(render({name: table}).split("\n", 1)[1])
    lines = [f"# W8A16 split-K GEMM (no outlier columns) vs cuBLAS bf16: {name}", "",
             f"torch {torch.__version__}, triton {triton.__version__}; x bf16; CUDA-graph medians, weights streamed "
             "from device memory. `x cuBLAS` > 1: faster than cuBLAS bf16.", "",
             "| N x K | M | cuBLAS bf16 us | W8A16 us | x cuBLAS | tiles |", "|---|---|---|---|---|---|"]
    for r in rows:
        c = r["w8a16_config"]
        lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {r['cublas_bf16_us']:.2f} | {r['w8a16_us']:.2f} | "
                     f"{r['w8a16_vs_cublas']:.2f} | {c['BM']}x{c['BN']}x{c['BK']} split {c['SPLIT_K']}, "
                     f"{c['num_warps']} warps, {c['num_stages']} stages |")
    with open(os.path.join(args.out, f"w8a16_{slug}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
