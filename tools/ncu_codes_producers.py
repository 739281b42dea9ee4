"""Hardware counters of the kernels that write a W8A8 GEMM's activation codes at a prefill's size (issue #14): each
variant launched twice (its compile, then the profiled launch) for ``ncu`` to read, 4,096 tokens, bf16:

    ncu --clock-control none --set full -k regex:'glu|swiglu|rms_norm|quantize_rows' \\
        python3 tools/ncu_codes_producers.py > ncu.txt
"""

from __future__ import annotations

import torch

from laquant.kernels.gemm.int8 import quantize_rows
from laquant.kernels.rowwise import fused
from laquant.quant.modules import QuantLinear

M = 4096


def packed_for(width: int, n_out: int):
    outliers = torch.randperm(width)[:n_out]
    return QuantLinear.from_linear(torch.nn.Linear(width, 64, bias=False).bfloat16(), outliers).cuda().packed()


def run(label: str, fn, tiled=None) -> None:
    fused.TILED_CODES_MIN_TOKENS = 10 ** 9 if tiled is None else 0
    if tiled is not None:
        fused.TILED_TOKENS = tiled
    torch.cuda.nvtx.range_push(label)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(label, flush=True)


def main() -> None:
    torch.manual_seed(0)
    bf = torch.bfloat16
    y = torch.randn(M, 2 * 5632, device="cuda", dtype=bf)
    gate, up = y.split(5632, dim=-1)
    x, r, w = (torch.randn(M, 2048, device="cuda", dtype=bf) for _ in range(3))
    w = w[0]
    p16, p0, n16 = packed_for(5632, 16), packed_for(5632, 0), packed_for(2048, 16)
    run("swiglu plain", lambda: fused.swiglu_triton(gate, up))
    run("swiglu codes n_out 0, one token a program", lambda: fused.swiglu_triton(gate, up, p0))
    run("swiglu codes n_out 16, one token a program", lambda: fused.swiglu_triton(gate, up, p16))
    run("rms_norm plain", lambda: fused.rms_norm_triton(x, w, 1e-6, r))
    run("rms_norm codes n_out 16, one token a program", lambda: fused.rms_norm_triton(x, w, 1e-6, r, packed=n16))
    run("rms_norm codes n_out 16, tiled 2", lambda: fused.rms_norm_triton(x, w, 1e-6, r, packed=n16),
        2)
    run("quantize_rows n_out 16", lambda: quantize_rows(x, n16))


if __name__ == "__main__":
    main()
