"""Launch sweep of the SSD (Mamba2) decode step, `ssd_decode_step`, at the Mamba2 families' head shape (H = 64 heads,
N = 128 state rows, P = 64 head dims, one group), B = 1 and 64, fp32 and int8_row with stochastic rounding (bf16 and
hybrid_int8's states): microseconds per call (CUDA-graph median) per (block_k, num_warps), as JSON lines.

    python3 tools/sweep_ssd_decode.py OUT.jsonl

The decode table's ``ssd`` entry is made by ``tools/sweep_kernels.py state_decode`` (every batch bucket and state
format, ``--write``); this script is the first sweep's, kept for eval/results/mamba2_decode_h200/run4_ssd_sweep/.
"""
import json
import sys

import torch
from triton.testing import do_bench_cudagraph

from laquant.kernels.common.state import StateQuantizer
from laquant.kernels.gla.decode import ssd_decode_step

H, G, N, P = 64, 1, 128, 64
CONFIGS = [(bk, w) for bk in (8, 16, 32, 64, 128) for w in (1, 2, 4, 8)]


def main(out_path: str) -> None:
    torch.manual_seed(0)
    out = open(out_path, "w")
    for fmt in ("fp32", "int8_row:stochastic"):
        name, _, rounding = fmt.partition(":")
        quant = StateQuantizer(name, rounding=rounding or "nearest")
        for B in (1, 64):
            x = torch.randn(B, H, P, device="cuda", dtype=torch.bfloat16)
            b_, c = (torch.randn(B, G, N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            dt = torch.randn(B, H, device="cuda", dtype=torch.bfloat16)
            dt_bias, A_log, D = (torch.randn(H, device="cuda") for _ in range(3))
            data, scale = StateQuantizer(name).store(torch.randn(B, H, N, P, device="cuda"))  # nearest: no key
            if scale is not None:
                scale = scale.squeeze(-1).contiguous()
            idx = torch.arange(B, device="cuda", dtype=torch.int32)
            n_stores = torch.zeros(B, device="cuda", dtype=torch.int32)
            y = torch.empty(B, H, P, device="cuda", dtype=torch.bfloat16)
            for bk, w in CONFIGS:
                def step(bk=bk, w=w):
                    return ssd_decode_step(c, b_, x, dt, dt_bias, A_log, D, None, data, scale, idx, quant,
                                           n_stores, out=y, block_k=bk, num_warps=w)
                try:
                    step()
                    us = do_bench_cudagraph(step, rep=50, return_mode="median") * 1e3
                except Exception as exc:  # a launch that does not compile or fit
                    us = None
                    print("failed", fmt, B, bk, w, repr(exc)[:200], flush=True)
                row = {"format": fmt, "B": B, "block_k": bk, "num_warps": w, "us": us}
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
