"""Emulated K-split of the GLA int8 decode kernel: the same state elements as (H heads of K rows) vs (2H of K/2) etc."""
import json, sys
import torch
import torch.nn.functional as F
sys.path.insert(0, "tools")
from laquant.kernels.gla.decode import gla_decode_step
from laquant.quant import StateQuantizer

def alone_us(B, H, K, V, bk, w, pf, pools=24, layers=24, reps=20):
    gen = torch.Generator(device="cuda").manual_seed(0)
    idx = torch.arange(B, device="cuda", dtype=torch.int32)
    n_stores = torch.zeros(B, device="cuda", dtype=torch.int32)
    q, k = (torch.randn(B, H, K, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(B, H, V, device="cuda", generator=gen).bfloat16()
    g = (F.logsigmoid(torch.randn(B, H, K, device="cuda", generator=gen)) / 16).bfloat16()
    quant = StateQuantizer("int8_row", rounding="stochastic")
    states = []
    for _ in range(pools):
        data, scale = StateQuantizer("int8_row").store(torch.randn(B, H, K, V, device="cuda", generator=gen) * 0.1)
        states.append((data, scale.squeeze(-1).contiguous()))
    def run():
        for i in range(layers):
            gla_decode_step(q, k, v, g, *states[i % pools], idx, quant, n_stores, block_k=bk, num_warps=w, seed=1,
                            prefetch=pf)
    run(); torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        graph.replay()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / reps / layers

res = []
for B in (64, 16):
    for rnd in range(3):
        for (H, K) in ((16, 64), (32, 32), (64, 16)):
            for bk, w, pf in ((8, 1, True), (4, 1, True), (16, 1, False), (8, 1, False), (16, 1, True)):
                if bk > K:
                    continue
                for pools in (1, 24):
                    us = alone_us(B, H, K, 128, bk, w, pf, pools)
                    r = dict(B=B, H=H, K=K, bk=bk, w=w, pf=pf, pools=pools, round=rnd, us=round(us, 3))
                    print(json.dumps(r), flush=True)
                    res.append(r)
import collections
med = collections.defaultdict(list)
for r in res:
    med[(r["B"], r["H"], r["K"], r["bk"], r["w"], r["pf"], r["pools"])].append(r["us"])
for key, v in sorted(med.items()):
    print(key, sorted(v)[1])
