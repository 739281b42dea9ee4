"""The kernels that write a W8A8 GEMM's activation codes (issue #14): the fused RMSNorm (with the residual
add), the gated RMSNorm, SwiGLU and the separate quantization pass, at decode and prefill row counts, with
and without outlier columns. CUDA-graph medians (``triton.testing.do_bench_cudagraph``), bf16.

Only public entry points are called, so the same script times another checkout of laquant (put it first
on PYTHONPATH) on the same GPU:

    python3 tools/bench_codes_producers.py --out codes.json [--label new] [--act per_token per_group] [--M 64]

``--act per_group``: the codes of a per-group GEMM (``act_granularity: per_group``; its pass is ``quantize_groups``),
beside per-token's in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch


def cases(Ms=(1, 64, 4096)):
    """``(name, M, width, n_out)``: GLA 1.37B's widths (2048 hidden, 16 x 128 value heads, 5,632 MLP) and a
    7B model's (4,096; 11,008)."""
    for M in Ms:
        for n_out in (0, 16):
            yield "rms_norm+res", M, 2048, n_out
            yield "gated_norm", M, 2048, n_out
            yield "swiglu", M, 5632, n_out
            yield "quantize_pass", M, 2048, n_out  # quantize_rows, or quantize_groups per group
            if M == 64:
                yield "rms_norm+res", M, 4096, n_out
                yield "swiglu", M, 11008, n_out


def packed_for(width: int, n_out: int, act: str = "per_token"):
    from laquant.quant.modules import QuantLinear

    outliers = torch.randperm(width, generator=torch.Generator().manual_seed(width + n_out))[:n_out]  # both acts
    return QuantLinear.from_linear(torch.nn.Linear(width, 64, bias=False).bfloat16(), outliers,
                                   act_granularity=act).cuda().packed()


def runner(name: str, M: int, width: int, packed):
    from laquant.kernels.gemm.int8 import quantize_groups, quantize_rows
    from laquant.kernels.rowwise.fused import gated_rms_norm_triton, rms_norm_triton, swiglu_triton

    dev, bf = "cuda", torch.bfloat16
    if name == "rms_norm+res":
        x, r, w = (torch.randn(M, width, device=dev, dtype=bf), torch.randn(M, width, device=dev, dtype=bf),
                   torch.randn(width, device=dev, dtype=bf))
        return lambda: rms_norm_triton(x, w, 1e-6, r, packed=packed)
    if name == "gated_norm":
        x, g = torch.randn(M, 16, width // 16, device=dev, dtype=bf), torch.randn(M, 16, width // 16, device=dev, dtype=bf)
        w = torch.randn(width // 16, device=dev, dtype=torch.float32)
        return lambda: gated_rms_norm_triton(x, g, w, 1e-6, packed=packed)
    if name == "swiglu":
        y = torch.randn(M, 2 * width, device=dev, dtype=bf)
        gate, up = y.split(width, dim=-1)
        return lambda: swiglu_triton(gate, up, packed)
    x = torch.randn(M, width, device=dev, dtype=bf)
    return lambda: (quantize_groups if packed.group else quantize_rows)(x, packed)


# --sweep-tiled: the norms' prefill codes path (kernels/rowwise/fused.py TILED_TOKENS) at a few token counts a
# program, against one token a program ("off"), in one process
TILED_NORM = (2, 4, 8)


def sweep_tiled(do_bench) -> list:
    from laquant.kernels.rowwise import fused

    base_min, base_tokens = fused.TILED_CODES_MIN_TOKENS, fused.TILED_TOKENS
    rows = []
    for M in (1024, 4096):
        for n_out in (0, 16):
            for width in (2048, 4096):
                fn = runner("rms_norm+res", M, width, packed_for(width, n_out))
                for tokens in (None, *TILED_NORM):
                    fused.TILED_CODES_MIN_TOKENS = 10 ** 9 if tokens is None else base_min
                    fused.TILED_TOKENS = tokens or base_tokens
                    fn()
                    us = do_bench(fn, rep=100) * 1e3
                    rows.append(dict(kernel="rms_norm+res", M=M, width=width, n_out=n_out,
                                     tiled="off" if tokens is None else tokens, us=us))
                    print(json.dumps(rows[-1]), flush=True)
                fused.TILED_CODES_MIN_TOKENS, fused.TILED_TOKENS = base_min, base_tokens
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--sweep-tiled", action="store_true", help="time the prefill codes path's launch choices")
    ap.add_argument("--act", nargs="+", default=["per_token"], choices=["per_token", "per_group"])
    ap.add_argument("--M", nargs="+", type=int, default=[1, 64, 4096], help="token counts")
    args = ap.parse_args()
    from triton.testing import do_bench_cudagraph

    import laquant

    torch.manual_seed(0)
    if args.sweep_tiled:
        rows = sweep_tiled(do_bench_cudagraph)
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
        return
    rows = []
    for (name, M, width, n_out), act in itertools.product(cases(args.M), args.act):
        fn = runner(name, M, width, packed_for(width, n_out, act))
        fn()
        us = do_bench_cudagraph(fn, rep=100) * 1e3
        rows.append(dict(kernel=name, act=act, M=M, width=width, n_out=n_out, us=us))
        print(json.dumps(rows[-1]), flush=True)
    out = dict(label=args.label, laquant=laquant.__file__, device=torch.cuda.get_device_name(),
               torch=torch.__version__, rows=rows)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
