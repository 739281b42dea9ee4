"""Where the 8-bit state's delta-rule decode step spends its time (issue #14): the kernel at its
launch blocks, with the stochastic rounding's parts swapped out one at a time (an experiment: the
variants patch Triton device functions in this process only; they do not round as laquant does).

    python tools/probe_state_decode.py VARIANT [OUT.jsonl]

VARIANT: ``base`` (the kernel as shipped, every state format), ``nearest_bits`` (int8 stochastic
with the random bytes replaced by a constant: the cost of drawing them), ``fast_round`` (Philox
bytes, rounding by ``floor(y + (r + 0.5) / 256)``), ``hash_bits`` (one integer hash per element in
the tile's own layout instead of Philox per 16 elements), ``hash_fast`` (both). One variant per
process, so that no compiled kernel is reused across patches.
"""
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

from laquant.kernels.common import triton_numerics
from laquant.kernels.common.state import StateQuantizer
from laquant.kernels.delta import decode as delta_decode_module

B, HK, H, K, V = 64, 16, 32, 128, 128
CONFIGS = [(16, 1), (16, 2), (32, 2), (32, 4), (64, 4), (128, 4), (128, 8), (128, 16)]


@triton.jit
def _const_bits(seed, slot, position, sub, h, offs_k, v0, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr):
    return tl.zeros([BK, BV], dtype=tl.int32) + 128


@triton.jit
def _hash_bits(seed, slot, position, sub, h, offs_k, v0, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
               BV: tl.constexpr):
    key = (seed + slot * 374761393 + position * 668265263 + sub * 2246822519).to(tl.uint32)
    key = (key ^ (key >> 15)) * 2146121005
    key = key ^ (key >> 16)
    x = ((h * K + offs_k)[:, None] * V + (v0 + tl.arange(0, BV))[None, :]).to(tl.uint32) + key
    x = (x ^ (x >> 16)) * 0x7feb352d
    x = (x ^ (x >> 15)) * 0x846ca68b
    return ((x ^ (x >> 16)) >> 24).to(tl.int32)


@triton.jit
def _fast_round(y, r):
    return tl.floor(y + (r.to(tl.float32) + 0.5) * 0.00390625)


def main(variant, out_path=None):
    if variant in ("nearest_bits",):
        delta_decode_module.state_random_bytes = _const_bits
    if variant in ("hash_bits", "hash_fast"):
        delta_decode_module.state_random_bytes = _hash_bits
    if variant in ("fast_round", "hash_fast"):
        triton_numerics.round_stochastic_int = _fast_round
    formats = ["int8_row:stochastic", "int8_row", "fp8_row:stochastic", "bf16", "fp32"] if variant == "base" \
        else ["int8_row:stochastic"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(B, HK, K, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(B, H, V, device="cuda", generator=gen).bfloat16()
    g = -F.softplus(torch.randn(B, H, device="cuda", generator=gen))
    beta = torch.rand(B, H, device="cuda", generator=gen)
    idx = torch.arange(B, device="cuda", dtype=torch.int32)
    n_stores = torch.zeros(B, device="cuda", dtype=torch.int32)
    rows = []
    for name in formats:
        fmt, _, rounding = name.partition(":")
        quant = StateQuantizer(fmt, rounding=rounding or "nearest")
        data, scale = StateQuantizer(fmt).store(torch.randn(B, H, K, V, device="cuda", generator=gen) * 0.1)
        scale = scale.squeeze(-1).contiguous() if scale is not None else None
        state_bytes = data.numel() * data.element_size() * 2 + (scale.numel() * 8 if scale is not None else 0)
        for bk, w in CONFIGS:
            run = lambda: delta_decode_module.delta_decode_step(  # noqa: E731
                q, k, v, g, beta, data, scale, idx, quant, n_stores, use_qk_l2norm=True, block_k=bk, num_warps=w,
                seed=1)
            try:
                us = do_bench_cudagraph(run, rep=100) * 1e3
            except Exception as e:  # a config that does not compile (registers, shared memory)
                print(f"{variant} {name} block_k={bk} warps={w}: FAILED {type(e).__name__}: {str(e)[:200]}",
                      flush=True)
                continue
            row = dict(variant=variant, format=name, block_k=bk, num_warps=w, us=round(us, 2),
                       GBps=round(state_bytes / us / 1e3, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
    if out_path:
        with open(out_path, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
