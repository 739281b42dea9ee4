"""Tile sweep for the int8 outlier GEMM (CUDA-graph timings, so launch overhead drops out)."""
import itertools

import torch
from triton.testing import do_bench_cudagraph

from laquant.kernels.gemm.int8 import _int8_gemm_kernel, quantize_rows
from laquant.quant.modules import QuantLinear

for (K, N), M in itertools.product([(4096, 4096), (2048, 2048)], [16, 2048, 8192]):
    lin = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    q = QuantLinear.from_linear(lin, torch.randperm(K)[:8])
    p = q.packed()
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    bf16 = do_bench_cudagraph(lambda: torch.nn.functional.linear(x, lin.weight), return_mode="median")
    quant = do_bench_cudagraph(lambda: quantize_rows(x, p), return_mode="median")
    xq, xs, xo = quantize_rows(x, p)
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    print(f"K={K} N={N} M={M}: bf16 {bf16 * 1e3:.1f} us, quantize_rows {quant * 1e3:.1f} us", flush=True)
    for BM, BN, BK, w, st, gm in itertools.product([64, 128], [128, 256], [128], [4, 8], [3, 4], [8]):
        if M <= 16 and BM > 64:
            continue
        try:
            grid = (((M + BM - 1) // BM) * ((N + BN - 1) // BN),)
            fn = lambda: _int8_gemm_kernel[grid](xq, p.qweight, xs, p.scale, xo, p.outlier_weight, xs, y, M, N, K,  # noqa
                                                 8, y.stride(0), BM=BM, BN=BN, BK=BK, BNO=16, GROUP_M=gm,
                                                 HAS_OUT=True, HAS_BIAS=False, num_warps=w, num_stages=st)
            ms = do_bench_cudagraph(fn, return_mode="median")
            print(f"  BM={BM} BN={BN} BK={BK} warps={w} stages={st}: {ms * 1e3:.1f} us "
                  f"({2 * M * N * K / ms / 1e9:.0f} TOPS)", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"  BM={BM} BN={BN} BK={BK} warps={w} stages={st}: {type(e).__name__}", flush=True)
