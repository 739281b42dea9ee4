"""Would the decode GEMMs gain from finding their weights in L2 (issue #14)? Two measurements on the GPU:

1. ``gemm``: the split-K int8 GEMM (the committed table's tiles, on codes made beforehand) and cuBLAS bf16 on the
   1.37B GLA's four shapes at M = 1 and 64, with the weights cold (every call the next of > 160 MB of copies, as a
   decode step streams them) and hot (the same copy every call: in L2 after the first).
2. ``layers``: the second half of a GLA layer's decode step at B = 64 in one CUDA graph over 6 layers of distinct
   weights and states (> 2 x L2): the int8-state decode kernel (stochastic rounding), then the o, gate/up and down
   GEMMs; with and without a small kernel launched before the decode kernel that asks for those GEMMs' weights in L2
   (``cp.async.bulk.prefetch.L2``, fire and forget) while the decode kernel, bound by its instructions, leaves
   DRAM bandwidth unused.

    python3 tools/l2_weights_probe.py OUT.json
"""
import json
import math
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

from sweep_gemm import SHAPES_GLA, make_weights, rotating

from laquant.kernels.common.state import StateQuantizer
from laquant.kernels.gemm.configs import choose_config
from laquant.kernels.common.gpus import device_name
from laquant.kernels.gemm.int8 import int8_gemm, quantize_rows
from laquant.kernels.gla.decode import gla_decode_step

STREAM_BYTES = 160 << 20


@triton.jit
def _prefetch_kernel(ptrs_ptr, sizes_ptr, n_ranges, CHUNK: tl.constexpr):
    """Program p asks for chunks p, p + P, ... of every range in L2, from its first thread."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for r in range(0, n_ranges):
        base = tl.load(ptrs_ptr + r)
        size = tl.load(sizes_ptr + r)
        for off in range(pid * CHUNK, size, nprog * CHUNK):
            tl.inline_asm_elementwise(
                "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
                "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r", [base + off, tl.minimum(size - off, CHUNK).to(tl.int32)], dtype=tl.int32, is_pure=False,
                pack=1)


def prefetch(tensors, programs=32, chunk=32768):
    ptrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device="cuda")
    sizes = torch.tensor([t.numel() * t.element_size() // 16 * 16 for t in tensors], dtype=torch.int64, device="cuda")

    def launch():
        _prefetch_kernel[(programs,)](ptrs, sizes, len(tensors), CHUNK=chunk, num_warps=1)
    return launch


def bench(fn):
    return do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def gemm_rows(dev):
    rows = []
    for N, K in SHAPES_GLA:
        copies = max(2, math.ceil(STREAM_BYTES / (N * K)))
        packs, _ = make_weights(N, K, copies, dev)
        wbf = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
               for _ in range(max(2, math.ceil(STREAM_BYTES / (2 * N * K))))]
        for M in (1, 64):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            codes = quantize_rows(x, packs[0])
            y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
            cfg = choose_config("w8a8", M, N, K, device_name(dev))

            def gemm(p):
                int8_gemm(*codes, p, y, cfg)
            rec = dict(N=N, K=K, M=M, config=cfg,
                       int8_cold_us=bench(rotating(gemm, packs)), int8_hot_us=bench(lambda: gemm(packs[0])),
                       bf16_cold_us=bench(rotating(lambda w: F.linear(x, w), wbf)),
                       bf16_hot_us=bench(lambda: F.linear(x, wbf[0])))
            rows.append(rec)
            print(rec, flush=True)
        del packs, wbf
    return rows


def layers_rows(dev, n_layers=6, B=64, H=16, Kd=64, V=128):
    quant = StateQuantizer("int8_row", rounding="stochastic")
    layers = []
    for i in range(n_layers):
        st = torch.randint(-127, 128, (B, H, Kd, V), dtype=torch.int8, device=dev)
        sc = torch.rand(B, H, Kd, device=dev) * 1e-2
        idx = torch.arange(B, dtype=torch.int32, device=dev)
        ns = torch.zeros(B, dtype=torch.int32, device=dev)
        q, k, g = (torch.randn(B, H, Kd, device=dev, dtype=torch.bfloat16) for _ in range(3))
        g = -g.float().abs().bfloat16()
        v = torch.randn(B, H, V, device=dev, dtype=torch.bfloat16)
        o = torch.empty(B, H, V, device=dev, dtype=torch.bfloat16)
        gemms = []
        for N, K in ((2048, 2048), (11264, 2048), (2048, 5632)):
            p = make_weights(N, K, 1, dev)[0][0]
            x = torch.randn(B, K, device=dev, dtype=torch.bfloat16)
            gemms.append((p, quantize_rows(x, p), torch.empty(B, N, device=dev, dtype=torch.bfloat16),
                          choose_config("w8a8", B, N, K, device_name(dev))))
        layers.append(dict(decode=(q, k, v, g, st, sc, idx, quant, ns, o), gemms=gemms))

    def step(pre):
        for layer in layers:
            if pre is not None:
                pre(layer)
            q, k, v, g, st, sc, idx, qz, ns, o = layer["decode"]
            gla_decode_step(q, k, v, g, st, sc, idx, qz, ns, out=o)
            for p, codes, y, cfg in layer["gemms"]:
                int8_gemm(*codes, p, y, cfg)

    for layer in layers:
        layer["pf_all"] = prefetch([p.qweight for p, *_ in layer["gemms"]])
        layer["pf_two"] = prefetch([p.qweight for p, *_ in layer["gemms"][:2]])
        layer["pf_none"] = prefetch([layer["gemms"][0][0].qweight[:1]])  # one 16-byte line: the launch alone
    out = {}
    for name, pre in (("no_prefetch", None), ("prefetch_launch_only", lambda L: L["pf_none"]()),
                      ("prefetch_o_gateup", lambda L: L["pf_two"]()),
                      ("prefetch_o_gateup_down", lambda L: L["pf_all"]()), ("no_prefetch_again", None)):
        us = bench(lambda: step(pre)) / n_layers  # noqa: B023
        out[name] = us
        print(name, f"{us:.2f} us a layer", flush=True)
    shared = layers[0]["gemms"]  # an upper bound: every layer's GEMMs on layer 0's weights (in L2 after the first)
    own = [layer["gemms"] for layer in layers]
    for layer in layers:
        layer["gemms"] = shared
    out["hot_weights"] = bench(lambda: step(None)) / n_layers
    print("hot_weights", f"{out['hot_weights']:.2f} us a layer", flush=True)
    for layer, g_ in zip(layers, own):
        layer["gemms"] = g_
    q, k, v, g, st, sc, idx, qz, ns, o = layers[0]["decode"]
    out["decode_alone_us"] = bench(lambda: gla_decode_step(q, k, v, g, st, sc, idx, qz, ns, out=o))
    return out


def main():
    dev = torch.device("cuda")
    res = dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__, triton=triton.__version__)
    res["layers"] = layers_rows(dev)
    res["gemm"] = gemm_rows(dev)
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
