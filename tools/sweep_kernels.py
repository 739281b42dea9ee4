"""Launch-parameter sweep for the decode and prefill kernels (GLA and the gated delta rule) (H100 numbers set the defaults).

    python tools/sweep_kernels.py decode [B H K V]
    python tools/sweep_kernels.py prefill T BLOCK_T BLOCK_V WARPS   (one config per process:
        a config that faults must not take the others down with it)
    python tools/sweep_kernels.py delta_decode
    python tools/sweep_kernels.py delta_prefill T BLOCK_T BLOCK_V WARPS
"""
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench, do_bench_cudagraph

from laquant.kernels.delta.chunk import chunk_delta_reference, chunk_delta_triton
from laquant.kernels.delta.decode import delta_decode_step
from laquant.kernels.gla.chunk import chunk_gla_reference, chunk_gla_triton
from laquant.kernels.gla.decode import gla_decode_step
from laquant.kernels.common.state import StateQuantizer


def _decode_formats(names):
    """``FORMAT`` or ``FORMAT:stochastic`` -> (label, quantizer)."""
    out = []
    for name in names:
        fmt, _, rounding = name.partition(":")
        out.append((name, StateQuantizer(fmt, rounding=rounding or "nearest")))
    return out


# SWEEP_FORMATS="int8_row int8_row:stochastic" narrows a sweep
DECODE_FORMATS = tuple(os.environ.get("SWEEP_FORMATS", "fp8_row fp8_row:stochastic int8_row int8_row:stochastic bf16 fp32")
                       .split())


def decode(B=64, H=64, K=128, V=128):
    """GLA decode step per state format (``:stochastic`` with the store counts), CUDA-graph median;
    the defaults are the bench shape, ``decode 64 16 64 128`` the e2e model's (1.37B GLA)."""
    q, k = (torch.randn(B, H, K, device="cuda").bfloat16() for _ in range(2))
    v = torch.randn(B, H, V, device="cuda").bfloat16()
    g = (F.logsigmoid(torch.randn(B, H, K, device="cuda")) / 16).bfloat16()
    idx = torch.arange(B, device="cuda", dtype=torch.int32)
    n_stores = torch.zeros(B, device="cuda", dtype=torch.int32)
    for name, quant in _decode_formats(DECODE_FORMATS):
        data, scale = StateQuantizer(quant.format.name).store(torch.randn(B, H, K, V, device="cuda"))
        scale = scale.squeeze(-1).contiguous() if scale is not None else None
        for bk in (8, 16, 32, 64):
            for w in (1, 2, 4, 8):
                if bk > K or bk * V // (32 * w) < 4:
                    continue
                run = lambda: gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores,  # noqa: E731
                                              block_k=bk, num_warps=w, seed=1)
                us = do_bench_cudagraph(run, rep=100) * 1e3
                print(f"decode B={B} H={H} K={K} V={V} {name} block_k={bk} warps={w}: {us:.1f} us", flush=True)


def prefill(T, bt, bv, w):
    Bp = 65536 // T
    q, k, v = (torch.randn(Bp, T, 16, 128, device="cuda").bfloat16() for _ in range(3))
    g = (F.logsigmoid(torch.randn(Bp, T, 16, 128, device="cuda")) / 16).bfloat16()
    run = lambda: chunk_gla_triton(q, k, v, g, block_t=bt, block_v=bv, num_warps=w)  # noqa: E731
    o = run()[0]
    n = min(Bp, 2)
    ref = chunk_gla_reference(q[:n, :2048], k[:n, :2048], v[:n, :2048], g[:n, :2048])[0]
    err = ((o[:n, :2048].float() - ref.float()).norm() / ref.float().norm()).item()
    ms = do_bench(run, return_mode="median")
    print(f"prefill T={T} block_t={bt} block_v={bv} warps={w}: {ms:.3f} ms (rel err {err:.1e})", flush=True)


def delta_decode():
    B, Hk, H, K = 64, 16, 32, 128
    q, k = (torch.randn(B, Hk, K, device="cuda").bfloat16() for _ in range(2))
    v = torch.randn(B, H, K, device="cuda").bfloat16()
    g, beta = -F.softplus(torch.randn(B, H, device="cuda")), torch.rand(B, H, device="cuda")
    idx = torch.arange(B, device="cuda", dtype=torch.int32)
    n_stores = torch.zeros(B, device="cuda", dtype=torch.int32)
    for name, quant in _decode_formats(DECODE_FORMATS):
        data, scale = StateQuantizer(quant.format.name).store(torch.randn(B, H, K, K, device="cuda") * 0.1)
        scale = scale.squeeze(-1).contiguous() if scale is not None else None
        for bk in (8, 16, 32, 64):
            for w in (1, 2, 4, 8):
                run = lambda: delta_decode_step(q, k, v, g, beta, data, scale, idx, quant, n_stores,  # noqa: E731
                                                use_qk_l2norm=True, block_k=bk, num_warps=w, seed=1)
                us = do_bench_cudagraph(run, rep=100) * 1e3
                print(f"delta_decode {name} block_k={bk} warps={w}: {us:.1f} us", flush=True)


def delta_prefill(T, bt, bv, w):
    Bp = 65536 // T
    q, k = (torch.randn(Bp, T, 16, 128, device="cuda").bfloat16() for _ in range(2))
    v = torch.randn(Bp, T, 32, 128, device="cuda").bfloat16()
    g, beta = -F.softplus(torch.randn(Bp, T, 32, device="cuda")) * 0.5, torch.rand(Bp, T, 32, device="cuda")
    run = lambda: chunk_delta_triton(q, k, v, g, beta, use_qk_l2norm=True, block_t=bt, block_v=bv,  # noqa: E731
                                     num_warps=w)
    o = run()[0]
    n = min(Bp, 2)
    cut = lambda x: x[:n, :1024]  # noqa: E731
    ref = chunk_delta_reference(cut(q), cut(k), cut(v), cut(g), cut(beta), use_qk_l2norm=True)[0]
    err = ((cut(o).float() - ref.float()).norm() / ref.float().norm()).item()
    ms = do_bench(run, return_mode="median")
    print(f"delta_prefill T={T} block_t={bt} block_v={bv} warps={w}: {ms:.3f} ms (rel err {err:.1e})", flush=True)


if __name__ == "__main__":
    modes = {"decode": decode, "prefill": prefill, "delta_decode": delta_decode, "delta_prefill": delta_prefill}
    modes[sys.argv[1]](*map(int, sys.argv[2:]))
