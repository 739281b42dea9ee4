"""Hardware counters of the W8A8 split-K GEMM at decode sizes (issue #14's M = 64, the 1.37B GLA's shapes, and M = 1):
each shape's GEMM launched twice on codes from quantize_rows (8 outlier columns), the table's tiles, for ``ncu``:

    ncu --clock-control none --set full -k regex:splitk python3 tools/ncu_decode_gemm.py
"""

from __future__ import annotations

import torch

from laquant.kernels.common.gpus import device_name
from laquant.kernels.gemm.int8 import choose_config, int8_gemm, quantize_rows
from laquant.quant.modules import QuantLinear

SHAPES = ((2048, 2048), (6144, 2048), (11264, 2048), (2048, 5632))


def main() -> None:
    torch.manual_seed(0)
    for M in (64, 1):
        for N, K in SHAPES:
            packed = QuantLinear.from_linear(torch.nn.Linear(K, N, bias=False).bfloat16(),
                                             torch.randperm(K)[:8]).cuda().packed()
            xq, xs, xo = quantize_rows(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), packed)
            y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            cfg = choose_config("w8a8", M, N, K, device_name(y.device))
            for _ in range(2):
                int8_gemm(xq, xs, xo, packed, y, cfg)
            torch.cuda.synchronize()
            print(M, N, K, cfg, flush=True)


if __name__ == "__main__":
    main()
