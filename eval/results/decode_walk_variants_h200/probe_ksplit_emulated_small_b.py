"""Emulated K-split of the decode kernels at small B: the same state elements as (H heads of K rows) vs (sH of K/s),
streamed from 24 pools; every launch (block_k x warps, prefetch) per shape, the fastest reported."""
import json, sys, itertools, collections
import torch
sys.path.insert(0, "tools")
from sweep_kernels import _decode_step
from laquant.quant import StateQuantizer
from triton.testing import do_bench_cudagraph

def bench(kernel, B, Hk, H, K, V, bk, w, pf, pools=24):
    step = _decode_step(kernel, B, Hk, H, K, V)
    quant = StateQuantizer("int8_row", rounding="stochastic")
    st = []
    for _ in range(pools):
        data, scale = StateQuantizer("int8_row").store(torch.randn(B, H, K, V, device="cuda") * 0.1)
        st.append((data, scale.squeeze(-1).contiguous()))
    from laquant.kernels.common import state_io
    key = state_io._decode_bucket(kernel, "int8_row", B * H)[0]
    saved = set(state_io.DECODE_PREFETCH)
    state_io.DECODE_PREFETCH.discard(key)
    if pf:
        state_io.DECODE_PREFETCH.add(key)
    try:
        us = do_bench_cudagraph(lambda: [step(d, c, quant, bk, w) for d, c in st], rep=20) * 1e3 / pools
    finally:
        state_io.DECODE_PREFETCH.clear(); state_io.DECODE_PREFETCH.update(saved)
    return us

cases = {"gla": [(16, 16, 64, 128), (32, 32, 32, 128), (64, 64, 16, 128)],
         "ssd": [(1, 64, 128, 64), (1, 128, 64, 64), (1, 256, 32, 64)]}
res = collections.defaultdict(dict)
for kernel, shapes in cases.items():
    for B in (1, 4, 16) if kernel == "gla" else (1, 4):
        for Hk, H, K, V in shapes:
            for bk, w, pf in itertools.product((8, 16, 32, 64, 128), (1, 2, 4, 8), (False, True)):
                if bk > K or bk * V // (32 * w) < 4 or (pf and kernel not in ("gla", "ssd")):
                    continue
                try:
                    us = bench(kernel, B, Hk, H, K, V, bk, w, pf)
                except Exception as e:
                    print("fail", kernel, B, H, K, bk, w, pf, repr(e)[:200], flush=True)
                    continue
                res[(kernel, B, H, K)][(bk, w, pf)] = round(us, 3)
                print(json.dumps(dict(kernel=kernel, B=B, H=H, K=K, bk=bk, w=w, pf=pf, us=round(us, 3))), flush=True)
print("SUMMARY")
for key, d in res.items():
    best = sorted(d.items(), key=lambda kv: kv[1])[:3]
    print(key, best)
