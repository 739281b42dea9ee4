"""Where SwiGLU-with-codes' time goes at a prefill's size (issue #14): stand-alone variants of the tiled codes
kernel, each leaving out or swapping one stage, timed against each other (CUDA-graph medians, 4,096 x 5,632 bf16,
16 outlier columns). Not laquant's kernel: a copy cut into stages.

    python3 tools/exp_glu_codes.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

from laquant.kernels.common.triton_numerics import int8_codes, rounded
from laquant.quant.modules import QuantLinear


@triton.jit
def _one_token(a_ptr, b_ptr, y_ptr, N, sa, sy, xq_ptr, xs_ptr, KQ, BLOCK_N: tl.constexpr, RECIP: tl.constexpr,
               BITS: tl.constexpr, STORE_Y: tl.constexpr):
    """The one-token-a-program path without outlier columns (codes from registers, in order): the division and
    the float -> int conversion swapped for a reciprocal and float32's bits; y's store left out."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < N
    a = tl.load(a_ptr + row * sa + cols, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * sa + cols, mask=ok, other=0.0).to(tl.float32)
    y = rounded(rounded(a * tl.sigmoid(a), tl.bfloat16) * b, tl.bfloat16)
    if STORE_Y:
        tl.store(y_ptr + row * sy + cols, y.to(tl.bfloat16), mask=ok)
    scale = tl.maximum(tl.max(tl.abs(y)) / 127.0, 1.1754943508222875e-38)
    tl.store(xs_ptr + row, scale)
    if RECIP:
        v = y * tl.math.div_rn(1.0, scale)
    else:
        v = tl.math.div_rn(y, scale)
    if BITS:
        q = ((tl.minimum(tl.maximum(v, -127.0), 127.0) + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000).to(tl.int8)
    else:
        q = int8_codes(v)
    tl.store(xq_ptr + row * KQ + cols, q, mask=ok)


@triton.jit
def _stages(a_ptr, b_ptr, y_ptr, M, N, sa, sy, src_ptr, dest_ptr, xq_ptr, xs_ptr, KQ,
            TOKENS: tl.constexpr, BLOCK_C: tl.constexpr, ABSMAX: tl.constexpr, CODES: tl.constexpr,
            GATHER: tl.constexpr, RECIP: tl.constexpr, STORE_Y: tl.constexpr, SIGMOID_FAST: tl.constexpr):
    rows = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    row_ok = rows < M
    a_rows = a_ptr + rows.to(tl.int64) * sa
    b_rows = b_ptr + rows.to(tl.int64) * sa
    y_rows = y_ptr + rows.to(tl.int64) * sy
    amax = tl.zeros([TOKENS], dtype=tl.float32)
    for c0 in range(0, N, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        a = tl.load(a_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if SIGMOID_FAST:
            s = rounded(a / (1.0 + tl.exp(-a)), tl.bfloat16)
        else:
            s = rounded(a * tl.sigmoid(a), tl.bfloat16)
        y = rounded(s * b, tl.bfloat16)
        if STORE_Y:
            tl.store(y_rows[:, None] + cols[None, :], y.to(tl.bfloat16), mask=mask)
        if ABSMAX:
            kept = col_ok & (tl.load(dest_ptr + cols, mask=col_ok, other=-1) >= 0)
            amax = tl.maximum(amax, tl.max(tl.where(kept[None, :], tl.abs(y), 0.0), axis=1))
    scale = tl.maximum(amax / 127.0, 1.1754943508222875e-38)
    tl.store(xs_ptr + rows, scale, mask=row_ok)
    if CODES:
        tl.debug_barrier()
        inv = tl.math.div_rn(1.0, scale)
        q_rows = xq_ptr + rows.to(tl.int64) * KQ
        for j0 in range(0, KQ, BLOCK_C):
            j = j0 + tl.arange(0, BLOCK_C)
            if GATHER:
                src = tl.load(src_ptr + j, mask=j < KQ, other=-1)
            else:
                src = tl.where(j < N, j, -1)
            x = tl.load(y_rows[:, None] + src[None, :], mask=row_ok[:, None] & (src >= 0)[None, :],
                        other=0.0).to(tl.float32)
            if RECIP:
                q = int8_codes(x * inv[:, None])
            else:
                q = int8_codes(tl.math.div_rn(x, scale[:, None]))
            tl.store(q_rows[:, None] + j[None, :], q, mask=row_ok[:, None] & (j < KQ)[None, :])


def main(out: str) -> None:
    torch.manual_seed(0)
    M, N = 4096, 5632
    y2 = torch.randn(M, 2 * N, device="cuda", dtype=torch.bfloat16)
    gate, up = y2.split(N, dim=-1)
    p = QuantLinear.from_linear(torch.nn.Linear(N, 64, bias=False).bfloat16(), torch.randperm(N)[:16]).cuda().packed()
    KQ = p.qweight.shape[1]
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    xq = torch.empty(M, KQ, device="cuda", dtype=torch.int8)
    xs = torch.empty(M, device="cuda", dtype=torch.float32)
    base = dict(ABSMAX=True, CODES=True, GATHER=True, RECIP=False, STORE_Y=True, SIGMOID_FAST=False)
    variants = {
        "product only (store y)": dict(base, ABSMAX=False, CODES=False),
        "product, no store": dict(base, ABSMAX=False, CODES=False, STORE_Y=False),
        "+ absmax": dict(base, CODES=False),
        "+ codes, gathered, div_rn (laquant's)": base,
        "+ codes, gathered, reciprocal": dict(base, RECIP=True),
        "+ codes, in order, div_rn": dict(base, GATHER=False),
        "+ codes, in order, reciprocal": dict(base, GATHER=False, RECIP=True),
        "laquant's, a / (1 + exp(-a))": dict(base, SIGMOID_FAST=True),
    }
    rows = []
    for tokens, block, warps in ((1, 2048, 4), (2, 1024, 4), (4, 512, 4), (2, 2048, 8)):
        for name, v in variants.items():
            fn = lambda: _stages[(triton.cdiv(M, tokens),)](  # noqa: E731
                gate, up, y, M, N, gate.stride(0), y.stride(0), p.source, p.dest, xq, xs, KQ, TOKENS=tokens,
                BLOCK_C=block, num_warps=warps, **v)
            fn()
            us = do_bench_cudagraph(fn, rep=100) * 1e3
            rows.append(dict(tokens=tokens, block=block, warps=warps, variant=name, us=us))
            print(json.dumps(rows[-1]), flush=True)
    for recip in (False, True):
        for bits in (False, True):
            for store_y in (True, False):
                fn = lambda: _one_token[(M,)](gate, up, y, N, gate.stride(0), y.stride(0), xq, xs, KQ,  # noqa: E731
                                              BLOCK_N=8192, RECIP=recip, BITS=bits, STORE_Y=store_y, num_warps=16)
                fn()
                us = do_bench_cudagraph(fn, rep=100) * 1e3
                rows.append(dict(variant=f"one token a program, recip {recip}, bits {bits}, store y {store_y}", us=us))
                print(json.dumps(rows[-1]), flush=True)
    plain = torch.empty_like(y)
    from laquant.kernels.rowwise.fused import swiglu_triton
    rows.append(dict(variant="laquant swiglu_triton, no codes", us=do_bench_cudagraph(lambda: swiglu_triton(gate, up),
                                                                                    rep=100) * 1e3))
    del plain
    print(json.dumps(rows[-1]), flush=True)
    with open(out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
