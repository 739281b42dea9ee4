"""Where the int8 state's decode step spends its instructions (issue #14's B = 64 step, #19's verify): the GLA decode
kernel with the int8 state (per-row scales renormalised every store, stochastic rounding) against staged variants of
its arithmetic, one change at a time, at the 1.37B GLA's shape (16 heads, K 64, V 128), CUDA-graph medians:

- ``shipped``: ``gla_decode_step`` with the table's launch; ``fp32`` / ``int8 nearest``: the same kernel's bounds;
- ``exp`` rows: a copy of its int8 path as of 2026-11-30 (the sign-magnitude rounding rule) with ``CLAMP`` (the clamp
  to +-127, a no-op under fresh or growing scales), ``RNG`` (0 the shipped bytes, ``state_random_bytes``: Philox-10
  until 2026-12-04, Philox-7 since; 1 a PCG hash a word of four bytes, 2 Philox-7, 3 none: nearest),
  ``SPLIT`` (the K rows split over this many programs a head, each writing its partial output).

    python tools/exp_state_step.py OUT.json [--shipped]   (timing; --shipped: the shipped kernel's rows only)
    ncu ... -k regex:_gla_decode_kernel python tools/exp_state_step.py --once   (one launch each, for ncu)
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from laquant.kernels.common.state import StateQuantizer
from laquant.kernels.common.triton_numerics import decode_state, state_random_bytes
from laquant.kernels.gla.decode import gla_decode_step

B, H, K, V = 64, 16, 64, 128


@triton.jit
def _pcg_bytes(seed, slot, position, h, offs_k, V: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
               BV: tl.constexpr):
    WORDS: tl.constexpr = BV // 4
    c = ((h * K + offs_k)[:, None] * WORDS + tl.arange(0, WORDS)[None, :]).to(tl.uint32)
    key = seed.to(tl.uint32) ^ (slot.to(tl.uint32) * 0x9E3779B9) ^ (position.to(tl.uint32) * 0x85EBCA6B)
    x = c * 747796405 + key
    w = ((x >> ((x >> 28) + 4)) ^ x) * 277803737
    w = (w >> 22) ^ w
    shifts = (tl.arange(0, 4) * 8).to(tl.uint32)
    return tl.reshape((w[:, :, None] >> shifts[None, None, :]) & 0xFF, [BK, BV]).to(tl.int32)


@triton.jit
def _exp_kernel(q_ptr, k_ptr, v_ptr, g_ptr, o_ptr, state_ptr, scale_ptr, seed, position,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr, CLAMP: tl.constexpr,
                RNG: tl.constexpr, SPLIT: tl.constexpr):
    pid = tl.program_id(0)
    part = tl.program_id(1)
    b = pid // H
    h = pid % H
    slot = b
    offs_v = tl.arange(0, V)
    v = tl.load(v_ptr + (b * H + h) * V + offs_v).to(tl.float32)
    readout = tl.zeros([BLOCK_K, V], dtype=tl.float32)
    ROWS: tl.constexpr = K // SPLIT
    for k0 in range(part * ROWS, part * ROWS + ROWS, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        base = (b * H + h) * K + offs_k
        q = tl.load(q_ptr + base).to(tl.float32) * 0.125
        kk = tl.load(k_ptr + base).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + base).to(tl.float32))
        ptrs = state_ptr + slot * H * K * V + h * K * V + offs_k[:, None] * V + offs_v[None, :]
        sc = tl.load(scale_ptr + slot * H * K + h * K + offs_k)
        st = decode_state(tl.load(ptrs), sc, 3)
        st = tl.fma(tl.broadcast_to(kk[:, None], st.shape), tl.broadcast_to(v[None, :], st.shape), st * decay[:, None])
        readout += q[:, None] * st
        scale = tl.maximum(tl.max(tl.abs(st), axis=1) / 127.0, 1.1754943508222875e-38)
        y = st * tl.math.div_rn(1.0, scale)[:, None]
        if CLAMP:
            y = tl.minimum(tl.maximum(y, -127.0), 127.0)
        if RNG == 3:
            n = (y + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000
        else:
            if RNG == 0:
                r = state_random_bytes(seed, slot, position, 0, h, offs_k, 0, K, V, BLOCK_K, V)
            elif RNG == 1:
                r = _pcg_bytes(seed, slot, position, h, offs_k, V, K, BLOCK_K, V)
            else:
                GROUPS: tl.constexpr = V // 16
                c0 = ((h * K + offs_k)[:, None] * GROUPS + tl.arange(0, GROUPS)[None, :]).to(tl.uint32)
                zero = c0 * 0
                w0, w1, w2, w3 = tl.philox(seed, c0, (zero + slot).to(tl.uint32), (zero + position).to(tl.uint32),
                                           zero, n_rounds=7)
                words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), [BLOCK_K, GROUPS, 4])
                shifts = (tl.arange(0, 4) * 8).to(tl.uint32)
                r = tl.reshape((words[:, :, :, None] >> shifts[None, None, None, :]) & 0xFF, [BLOCK_K, V]).to(tl.int32)
            m = (tl.abs(y) + 32768.0).to(tl.int32, bitcast=True) - 0x47000000
            mag = (m + r) >> 8
            n = tl.where(y < 0, -mag, mag)
        tl.store(ptrs, n.to(tl.int8))
        tl.store(scale_ptr + slot * H * K + h * K + offs_k, scale)
    o = tl.sum(readout, axis=0)
    tl.store(o_ptr + ((b * H + h) * SPLIT + part) * V + offs_v, o)


def main() -> None:
    once = "--once" in sys.argv
    from triton.testing import do_bench_cudagraph

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(B, H, K, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(B, H, V, device="cuda", generator=gen).bfloat16()
    g = (F.logsigmoid(torch.randn(B, H, K, device="cuda", generator=gen)) / 16).bfloat16()
    idx = torch.arange(B, device="cuda", dtype=torch.int32)
    n_stores = torch.zeros(B, device="cuda", dtype=torch.int32)
    init = torch.randn(B, H, K, V, device="cuda", generator=gen) * 0.1
    rows = []

    def bench(name, fn, moved):
        if once:
            fn()
            torch.cuda.synchronize()
            return
        us = do_bench_cudagraph(fn, rep=100) * 1e3
        row = dict(variant=name, us=round(us, 2), GBps=round(moved / us / 1e3, 1))
        rows.append(row)
        print(json.dumps(row), flush=True)

    for fmt, rounding in (("fp32", "nearest"), ("int8_row", "nearest"), ("int8_row", "stochastic")):
        quant = StateQuantizer(fmt, rounding=rounding)
        data, scale = StateQuantizer(fmt).store(init)
        scale = scale.squeeze(-1).contiguous() if scale is not None else None
        moved = 2 * data.numel() * data.element_size() + (2 * scale.numel() * 4 if scale is not None else 0)
        bench(f"shipped {fmt} {rounding}",
              lambda: gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores, seed=1), moved)
    data, scale = StateQuantizer("int8_row").store(init)
    scale = scale.squeeze(-1).contiguous()
    moved = 2 * data.numel() + 2 * scale.numel() * 4
    for split in () if "--shipped" in sys.argv else (1, 2, 4):
        o = torch.empty(B, H, split, V, device="cuda")
        for rng in (0, 1, 2, 3):
            for clamp in (1, 0):
                for bk, w in ((16, 1), (8, 1), (16, 2)):
                    if bk > K // split:
                        continue
                    bench(f"exp split={split} rng={rng} clamp={clamp} block_k={bk} warps={w}",
                          lambda: _exp_kernel[(B * H, split)](q, k, v, g, o, data, scale, 12345, 7, H=H, K=K, V=V,
                                                               BLOCK_K=bk, CLAMP=clamp, RNG=rng, SPLIT=split,
                                                               num_warps=w), moved)
    if not once:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       shape=dict(B=B, H=H, K=K, V=V), rows=rows), open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
