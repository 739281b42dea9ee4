"""MLA's absorbed decode attention, one layer (issue #14): laquant's kernel (kernels/attention/latent.py) against the
PyTorch ops it replaced (laquant.models.mla_attention: two batched GEMMs and a third for the rope part, scaling, mask,
softmax, cast), bf16, CUDA-graph medians, at Kimi Linear's shape (16 heads, latent 512, rope part 64); a static cache
of CAPACITY positions with SEEN written; the kernel also at each split count and position block given.

    python3 tools/bench_latent_attention.py OUT.json [--splits 2 4 8] [--blocks 16 32 64]
"""
import argparse
import json

import torch
import triton

from laquant.eval.speed import versions
from laquant.kernels.attention import latent

H, R, P = 16, 512, 64


def graph_us(fn, rep: int = 50) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=rep) * 1e3


def torch_ops(ql, qr, c, kr, mask, scaling):
    scores = torch.baddbmm(torch.bmm(ql, c.transpose(1, 2)), qr, kr.transpose(1, 2)) * scaling
    scores = scores + mask[:, 0, :, :scores.shape[-1]]
    return torch.bmm(torch.softmax(scores, dim=-1, dtype=torch.float32).to(ql.dtype), c)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--splits", type=int, nargs="*", default=[])
    ap.add_argument("--blocks", type=int, nargs="*", default=[])
    args = ap.parse_args()
    rows = []
    for B in (1, 64):
        for capacity, seen in ((1100, 1030), (2048, 1030)):
            ql, qr = (torch.randn(B, H, d, device="cuda", dtype=torch.bfloat16) for d in (R, P))
            c, kr = (torch.randn(B, capacity, d, device="cuda", dtype=torch.bfloat16) for d in (R, P))
            mask = torch.full((B, 1, 1, capacity), torch.finfo(torch.bfloat16).min, device="cuda", dtype=torch.bfloat16)
            mask[..., :seen + 1] = 0
            s = 192 ** -0.5
            want = latent.latent_attention(ql, qr, c, kr, mask, s).float()
            got = latent.latent_attention_triton(ql, qr, c, kr, mask, s).float()
            t_ops = graph_us(lambda: torch_ops(ql, qr, c, kr, mask, s))
            t_kernel = graph_us(lambda: latent.latent_attention_triton(ql, qr, c, kr, mask, s))
            read = B * (seen + 1) * (R + P) * 2  # the written latents and rope parts, bf16, once
            sweep = {}
            default_block = latent.BLOCK_S
            for block in args.blocks or [default_block]:
                latent.BLOCK_S = block
                for n in args.splits:
                    sweep[f"block {block}, splits {n}"] = round(graph_us(
                        lambda n=n: latent.latent_attention_triton(ql, qr, c, kr, mask, s, splits=n), 30), 2)
            latent.BLOCK_S = default_block
            row = dict(B=B, capacity=capacity, seen=seen, torch_ops_us=round(t_ops, 2), kernel_us=round(t_kernel, 2),
                       speedup=round(t_ops / t_kernel, 2), rel_err=((got - want).norm() / want.norm()).item(),
                       kernel_GBps_of_written_latents=round(read / (t_kernel * 1e-6) / 1e9), kernel_us_by_launch=sweep)
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(args.out, "w") as f:
        json.dump(dict(**versions(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
