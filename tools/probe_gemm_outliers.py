"""What the outlier columns cost the int8 GEMMs, by their number.

The hybrid_int8 prefill of the 1.14B qwen3_next spent 5.0 ms in 64 tiled GEMM launches where the
tiles' sweep (8 outlier columns) predicts ~2.7 ms; calibrated on random tokens, its down_proj keeps
~270 of 5,632 input columns in bf16. For N x K in {2048x5632 (down_proj), 2048x2048}, M in
{1, 64, 1024, 4096} and 0 / 8 / 64 / 270 outlier columns: the shipped GEMM on pre-made codes at the
table's tiles (split-K at M <= 256, tiled above), and at M >= 1024 the tiled kernel as it was before
the outlier product accumulated into the output tile (``_old_tiled_kernel`` below, a copy). CUDA-graph
medians, checked against a float32 reference.

    python tools/probe_gemm_outliers.py OUT.json
"""
import json
import sys

import sweep_gemm
import torch
import triton
import triton.language as tl
from sweep_gemm import bench, make_weights, reference, rel

from laquant.kernels.gemm.configs import choose_config
from laquant.kernels.gemm.int8 import _bno, int8_gemm, quantize_rows


@triton.jit
def _old_tiled_kernel(a_ptr, w_ptr, xs_ptr, ws_ptr, xo_ptr, wo_ptr, y_ptr, M, N, K, NO, s_ym,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BNO: tl.constexpr,
                      GROUP_M: tl.constexpr, HAS_OUT: tl.constexpr):
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    group = pid // (GROUP_M * n_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * n_n)) % size_m
    pid_n = (pid % (GROUP_M * n_n)) // size_m
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    mm = offs_m < M
    mn = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * K + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]
    acc = tl.zeros([BM, BN], dtype=tl.int32)
    for k0 in range(0, K, BK):
        mk = (k0 + offs_k) < K
        a = tl.load(a_ptrs, mask=mm[:, None] & mk[None, :], other=0)
        w = tl.load(w_ptrs, mask=mk[:, None] & mn[None, :], other=0)
        acc = tl.dot(a, w, acc, out_dtype=tl.int32)
        a_ptrs += BK
        w_ptrs += BK
    xs = tl.load(xs_ptr + offs_m, mask=mm, other=0.0)
    ws = tl.load(ws_ptr + offs_n, mask=mn, other=0.0)
    y = acc.to(tl.float32) * xs[:, None] * ws[None, :]
    if HAS_OUT:
        for o0 in range(0, NO, BNO):
            offs_o = o0 + tl.arange(0, BNO)
            mo = offs_o < NO
            xo = tl.load(xo_ptr + offs_m[:, None].to(tl.int64) * NO + offs_o[None, :],
                         mask=mm[:, None] & mo[None, :], other=0.0)
            wo = tl.load(wo_ptr + offs_n[None, :].to(tl.int64) * NO + offs_o[:, None],
                         mask=mo[:, None] & mn[None, :], other=0.0)
            y = y + tl.dot(xo, wo.to(xo.dtype))
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * s_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mm[:, None] & mn[None, :])


def old_tiled(codes, p, y, cfg):
    xq, xs, xo = codes
    cfg = dict(cfg)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    M, N = y.shape
    NO = p.outlier_idx.numel()
    grid = (triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, cfg["BN"]),)
    _old_tiled_kernel[grid](xq, p.qweight, xs, p.scale, xo, p.outlier_weight, y, M, N, p.qweight.shape[1], NO,
                            y.stride(0), BNO=_bno(NO, y.dtype), HAS_OUT=NO > 0, num_warps=warps, num_stages=stages,
                            **cfg)
    return y


def main(out_path: str) -> None:
    dev = torch.device("cuda")
    rows = []
    for (N, K) in ((2048, 5632), (2048, 2048)):
        for n_out in (0, 8, 64, 270):
            sweep_gemm.N_OUT = n_out
            packs, keep_idx = make_weights(N, K, 1, dev)
            p = packs[0]
            for M in (1, 64, 1024, 4096):
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                x[:, p.outlier_idx.long()] *= 30
                ref = reference(x, p, keep_idx)
                codes = quantize_rows(x, p)
                y = torch.empty(M, N, device=dev, dtype=x.dtype)
                cfg = choose_config("w8a8", M, N, K)
                int8_gemm(*codes, p, y, cfg)
                rec = dict(N=N, K=K, M=M, n_outliers=n_out, config=cfg, rel_err=rel(y.clone(), ref),
                           us=bench(lambda: int8_gemm(*codes, p, y, cfg)))  # noqa: B023
                if "SPLIT_K" not in cfg:
                    rec["old_rel_err"] = rel(old_tiled(codes, p, y, cfg).clone(), ref)
                    rec["old_us"] = bench(lambda: old_tiled(codes, p, y, cfg))  # noqa: B023
                rows.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "config"}), flush=True)
    with open(out_path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
