"""Tile sweep of the tiled W8A8 GEMM (``_int8_gemm_kernel``) at prefill sizes, against cuBLAS.

A hybrid_int8 prefill of 1,024 tokens on the 1.14B qwen3_next spent more GPU time in its int8 GEMMs
(5.0 ms, 64 launches) than bf16 did in cuBLAS's (~3 ms): compute-bound tiles at ~435 int8 TOPS
(``eval/results/gemm_prefill_h200/``). For each layer shape (N x K: the hybrid's and GLA's) and
M in {1024, 4096}: cuBLAS bf16 (``F.linear``), cuBLAS int8 (``torch._int_mm``, the int32 product
alone: no scales, no outliers, the ceiling of an int8 GEMM on this GPU), the tiled kernel with
``configs.tiled_config(M)`` (what ships) and with each candidate tile, timed on codes made
beforehand (the model's norms write them). Every candidate is checked against a float32 reference
first. CUDA-graph medians.

    python tools/sweep_gemm_prefill.py OUT_DIR      # writes OUT_DIR/gemm_prefill_<device>.{json,md}
    python tools/sweep_gemm_prefill.py OUT_DIR --shapes gla --ms 4096   # the 1.37B GLA's shapes, 4,096 rows

The int8 dot's wgmma is synchronous in Triton (a float32 accumulator is the condition for an asynchronous one):
each K step waits for its products before the next is issued, so 256-wide K steps (half the waits per product)
are in the space too, at the pipeline depths that fit shared memory.
"""
import argparse
import itertools
import json
import os

import torch
import torch.nn.functional as F
import triton
from sweep_gemm import SHAPES_GLA, bench, make_weights, reference, rel

from laquant.kernels.gemm.configs import tiled_config
from laquant.kernels.gemm.int8 import int8_gemm, quantize_rows

# qwen3_next's in_proj_qkvz, out_proj / o_proj, gate+up, down, the softmax layers' q(gated)+k+v; GLA's q/k/v/g, o
SHAPES = [(12288, 2048), (2048, 4096), (11264, 2048), (2048, 5632), (9216, 2048), (6144, 2048), (2048, 2048)]
MS = (1024, 4096)
SMEM_BYTES = 200 * 1024  # the int8 tiles' pipeline buffers (Hopper: 227 KB a block, less the epilogue's)


def candidates():
    out = []
    for BM, BN, BK, warps, stages in itertools.product((64, 128), (128, 256), (64, 128, 256), (4, 8), (2, 3, 4)):
        if BM == 64 and (BN == 256 or warps == 8):
            continue
        if stages * (BM + BN) * BK > SMEM_BYTES or (stages == 2 and BK < 256):
            continue
        out.append(dict(BM=BM, BN=BN, BK=BK, GROUP_M=8, num_warps=warps, num_stages=stages))
    return out


def main(out_dir: str, shapes=SHAPES, ms=MS) -> None:
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    slug = "h200" if "H200" in name else "h100" if "H100" in name else name.lower().replace(" ", "_")
    rows = []
    for (N, K), M in itertools.product(shapes, ms):
        packs, keep_idx = make_weights(N, K, 1, dev)
        p = packs[0]
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        x[:, p.outlier_idx.long()] *= 30
        ref = reference(x, p, keep_idx)
        codes = quantize_rows(x, p)
        y = torch.empty(M, N, device=dev, dtype=x.dtype)
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
        wq_t = p.qweight.t()  # [KQ, N], column-major: cuBLAS's int8 layout
        ops = 2 * M * N * K
        rec = dict(N=N, K=K, M=M, cublas_bf16_us=bench(lambda: F.linear(x, w)))
        try:
            rec["cublas_int8_mm_us"] = bench(lambda: torch._int_mm(codes[0], wq_t))
        except RuntimeError as e:  # a layout this torch's _int_mm refuses
            print(f"_int_mm: {e}", flush=True)
            rec["cublas_int8_mm_us"] = float("inf")

        def gemm(c):
            int8_gemm(*codes, p, y, c)
            return y

        shipped = tiled_config(M)
        rec["shipped_config"] = shipped
        rec["shipped_us"] = bench(lambda: gemm(shipped))
        best, rejected = None, []
        for c in candidates():
            try:
                err = rel(gemm(c).clone(), ref)
                if not err < 2e-2:
                    rejected.append(f"{c}: rel err {err}")
                    continue
                us = bench(lambda: gemm(c))  # noqa: B023
            except Exception as e:  # noqa: BLE001  (out of shared memory, ...)
                rejected.append(f"{c}: {type(e).__name__}")
                continue
            if best is None or us < best[0]:
                best = (us, c, err)
        rec["best_us"], rec["best_config"], rec["best_rel_err"] = best
        rec["rejected"] = rejected
        for key in ("cublas_bf16", "cublas_int8_mm", "shipped", "best"):
            rec[f"{key}_tops"] = ops / rec[f"{key}_us"] / 1e6
        rows.append(rec)
        print(f"{N}x{K} M={M}: bf16 {rec['cublas_bf16_us']:.1f} us ({rec['cublas_bf16_tops']:.0f} TFLOPS), "
              f"_int_mm {rec['cublas_int8_mm_us']:.1f} ({rec['cublas_int8_mm_tops']:.0f}), shipped "
              f"{rec['shipped_us']:.1f} ({rec['shipped_tops']:.0f}), best {rec['best_us']:.1f} "
              f"({rec['best_tops']:.0f}) {rec['best_config']}", flush=True)
    meta = dict(device=name, torch=torch.__version__, triton=triton.__version__, shapes=shapes, M=ms,
                x_dtype="bfloat16", n_outliers=8, timing="do_bench_cudagraph(rep=5) median, GEMM alone on pre-made codes")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"gemm_prefill_{slug}.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    lines = [f"# The tiled int8 GEMM at prefill sizes: {name}", "",
             f"torch {torch.__version__}, triton {triton.__version__}; x bf16, 8 outlier columns, no bias; "
             "CUDA-graph medians; the GEMM alone on codes made beforehand. TOPS = 2MNK / time. "
             "`_int_mm`: cuBLAS's int8 x int8 -> int32 alone (no scales, outliers or bf16 output).", "",
             "| N x K | M | cuBLAS bf16 us (TFLOPS) | _int_mm us (TOPS) | shipped us (TOPS) | best us (TOPS) | best tiles |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["best_config"]
        lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {r['cublas_bf16_us']:.1f} ({r['cublas_bf16_tops']:.0f}) | "
                     f"{r['cublas_int8_mm_us']:.1f} ({r['cublas_int8_mm_tops']:.0f}) | {r['shipped_us']:.1f} "
                     f"({r['shipped_tops']:.0f}) | {r['best_us']:.1f} ({r['best_tops']:.0f}) | "
                     f"{c['BM']}x{c['BN']}x{c['BK']} w{c['num_warps']} s{c['num_stages']} |")
    with open(os.path.join(out_dir, f"gemm_prefill_{slug}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--shapes", choices=("all", "gla"), default="all")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="rows, e.g. 1024,4096")
    args = ap.parse_args()
    main(args.out_dir, SHAPES_GLA if args.shapes == "gla" else SHAPES, tuple(int(m) for m in args.ms.split(",")))
