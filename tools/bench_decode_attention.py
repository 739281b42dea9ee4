"""The static decode steps' attention, one layer (issue #14): laquant's kernel (kernels/attention/decode.py) against
the grouped eager formula it replaced (laquant.models.static_hybrid, transformers' eager attention without repeated
keys), bf16, CUDA-graph medians, at the attention shapes of the e2e hybrids; a static cache of CAPACITY positions
with SEEN written (laquant's own loop keeps ~prompt + steps, transformers' generate 1,024 of room more).

    python3 tools/bench_decode_attention.py OUT.json [--splits 1 2 4 8]   # also the kernel at each split count
"""
import json
import sys

import torch
import triton

from laquant.eval.speed import versions
from laquant.kernels.attention.decode import decode_attention, decode_attention_triton
from laquant.models.static_hybrid import grouped_eager_attention as eager

SHAPES = {"zamba2 (MHA, 32 heads)": (32, 32, 128), "falcon_h1 (GQA 16/4)": (16, 4, 128),
          "qwen3_next-style (GQA 16/2, D 256)": (16, 2, 256)}


def graph_us(fn, rep: int = 50) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=rep) * 1e3


def main(out: str, split_counts=()) -> None:
    rows = []
    for name, (Hq, Hkv, D) in SHAPES.items():
        for B in (1, 64):
            for capacity, seen in ((1100, 1030), (2048, 1030)):
                q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(B, Hkv, capacity, D, device="cuda", dtype=torch.bfloat16)
                v = torch.randn_like(k)
                mask = torch.full((B, 1, 1, capacity), torch.finfo(torch.bfloat16).min, device="cuda",
                                  dtype=torch.bfloat16)
                mask[..., :seen + 1] = 0
                s = D ** -0.5
                want = decode_attention(q, k, v, mask, s).float()
                got = decode_attention_triton(q, k, v, mask, s).float()
                err = ((got - want).norm() / want.norm()).item()
                t_eager = graph_us(lambda: eager(q, k, v, mask, s))
                t_kernel = graph_us(lambda: decode_attention_triton(q, k, v, mask, s))
                read = 2 * B * Hkv * (seen + 1) * D * 2  # the written keys and values, bf16
                by_splits = {n: round(graph_us(lambda n=n: decode_attention_triton(q, k, v, mask, s, splits=n), 30), 2)
                             for n in split_counts}
                row = dict(shape=name, B=B, capacity=capacity, seen=seen, eager_us=round(t_eager, 2),
                           kernel_us=round(t_kernel, 2), speedup=round(t_eager / t_kernel, 2), rel_err=err,
                           kernel_GBps_of_written_kv=round(read / (t_kernel * 1e-6) / 1e9),
                           kernel_us_by_splits=by_splits)
                print(json.dumps(row), flush=True)
                rows.append(row)
    with open(out, "w") as f:
        json.dump(dict(**versions(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], [int(a) for a in sys.argv[3:]] if sys.argv[2:3] == ["--splits"] else ())
