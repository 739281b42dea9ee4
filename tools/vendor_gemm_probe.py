"""What the vendor's GEMMs do at decode sizes, beside laquant's split-K int8 GEMM (issue #14: the decode GEMMs sit
at 21-56% of copy bandwidth at M = 64 on the 1.37B GLA's shapes, and every Triton tile swept stays there).

For each shape (N x K) and M: cuBLAS bf16 (``F.linear``), laquant's W8A8 GEMM alone on codes made beforehand (the
committed table's tiles, as the model runs it), cuBLAS's int8 GEMM (``torch._int_mm``: int32 out, no epilogue; the
row / column scales would still have to be applied somewhere), the same plus its scaling as PyTorch ops (what an
unfused epilogue costs), and the fp8 e4m3 GEMM with per-row and per-column scales in cuBLASLt's epilogue
(``torch._scaled_mm``, bf16 out: one kernel, what an fp8 W8A8 recipe would run). CUDA-graph medians; every call takes
the next of several weight copies (> 2 x L2), so the weights stream from device memory. Each path's output is
checked against a float32 product of the same quantized operands first.

    python tools/vendor_gemm_probe.py --out DIR [--shapes gla] [--m 1,16,32,64,128]
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F

from laquant.kernels.gemm.configs import choose_config
from laquant.kernels.common.gpus import device_name
from laquant.kernels.gemm.int8 import PackedOutlierWeight, int8_gemm, quantize_rows
from sweep_gemm import STREAM_BYTES, bench, rel, rotating  # the sweep's timing and check: the tables compare

SHAPES = {"gla": [(6144, 2048), (2048, 2048), (11264, 2048), (2048, 5632)],
          "7b": [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="gla")
    ap.add_argument("--m", default="1,16,32,64,128")
    ap.add_argument("--n-out", type=int, default=0, help="outlier columns of laquant's GEMM (the vendors' have none)")
    ap.add_argument("--laquant-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    name = device_name(dev)
    rows = []
    for N, K in SHAPES[args.shapes]:
        copies = max(2, math.ceil(STREAM_BYTES / (N * K)))
        gen = torch.Generator(device=dev).manual_seed(N + K)
        q8 = [torch.randint(-127, 128, (N, K), device=dev, dtype=torch.int8, generator=gen) for _ in range(copies)]
        scale = torch.rand(N, device=dev, generator=gen) * 1e-3 + 1e-4
        perm = torch.randperm(K, device=dev, generator=gen)
        outl, keep = perm[:args.n_out].sort().values, perm[args.n_out:].sort().values
        KQ = -(-keep.numel() // 16) * 16
        q8 = [torch.nn.functional.pad(q[:, :keep.numel()], (0, KQ - keep.numel())) for q in q8]
        wo = (torch.randn(N, args.n_out, device=dev, generator=gen) * 0.05).bfloat16()
        packs = [PackedOutlierWeight.pack(q, scale, keep, outl, wo, None, K) for q in q8]
        f8 = [q.float().to(torch.float8_e4m3fn) for q in q8]  # same bytes as int8; speed only (e4m3 rounds them)
        wbf = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
               for _ in range(max(2, math.ceil(STREAM_BYTES / (2 * N * K))))]
        for M in [int(m) for m in args.m.split(",")]:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            xq, xs, xo = quantize_rows(x, packs[0])
            ref = (xq.float() @ q8[0].float().T) * xs[:, None] * scale[None, :] + x[:, outl].float() @ wo.float().T
            rec = dict(N=N, K=K, M=M, n_out=args.n_out)
            rec["cublas_bf16_us"] = bench(rotating(lambda w: F.linear(x, w), wbf))
            cfg = choose_config("w8a8", M, N, K, name)
            y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)

            def ours(p):
                int8_gemm(xq, xs, xo, p, y, cfg)
                return y
            ours(packs[0])
            rec["laquant_w8a8_rel"] = rel(y, ref)
            rec["laquant_w8a8_us"] = bench(rotating(ours, packs))
            rec["laquant_cfg"] = cfg
            rec["int8_weight_MB"] = N * K / 1e6
            rec["laquant_pct_of_4_2TBps"] = round(100 * N * K / rec["laquant_w8a8_us"] / 4.2e6, 1)
            if args.laquant_only:
                rows.append(rec)
                print(json.dumps(rec), flush=True)
                continue
            if M > 16:  # cuBLAS's int8 GEMM needs M > 16
                acc = torch._int_mm(xq, q8[0].T)
                rec["int_mm_exact"] = bool(torch.equal(acc.double(), (xq.double() @ q8[0].double().T)))
                rec["int_mm_us"] = bench(rotating(lambda q: torch._int_mm(xq, q.T), q8))
                rec["int_mm_scaled_us"] = bench(rotating(
                    lambda q: (torch._int_mm(xq, q.T).float() * xs[:, None] * scale[None, :]).to(torch.bfloat16), q8))
            xf8 = xq.float().to(torch.float8_e4m3fn)  # the fp8 path's own operands: speed only, not laquant's codes
            sa, sb = xs[:, None].contiguous(), scale[None, :].contiguous()
            try:
                yf = torch._scaled_mm(xf8, f8[0].T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
                ref8 = (xf8.float() @ f8[0].float().T) * sa * sb
                rec["fp8_rowwise_rel"] = rel(yf, ref8)
                rec["fp8_rowwise_us"] = bench(rotating(
                    lambda w: torch._scaled_mm(xf8, w.T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), f8))
            except (RuntimeError, TypeError) as e:  # noqa: PERF203
                rec["fp8_rowwise_error"] = str(e)[:200]
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    with open(os.path.join(args.out, "vendor_gemm.json"), "w") as f:
        json.dump(dict(device=name, torch=torch.__version__, rows=rows), f, indent=1)
    lines = ["| N x K | M | cuBLAS bf16 us | laquant W8A8 us | cuBLAS int8 (_int_mm) us | _int_mm + scaling ops us "
             "| fp8 rowwise _scaled_mm us |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        f = lambda k: f"{r[k]:.2f}" if k in r else "-"  # noqa: E731
        lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {f('cublas_bf16_us')} | {f('laquant_w8a8_us')} | "
                     f"{f('int_mm_us')} | {f('int_mm_scaled_us')} | {f('fp8_rowwise_us')} |")
    with open(os.path.join(args.out, "vendor_gemm.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
