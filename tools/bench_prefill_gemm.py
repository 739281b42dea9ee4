"""The int8 GEMM at prefill sizes (issue #14's prefill target): what could beat cuBLAS bf16 there.

Triton keeps only fp32-accumulator wgmma in flight across K steps, so the tiled int8 kernel drains the
tensor cores at every K step (eval/results/serving_h100.md). For the model's shapes at M = 512 ... 8192
this times, each checked against a float32 reference first:

* cuBLAS bf16 (``F.linear``), the peer;
* laquant's tiled W8A8 kernel on codes made beforehand, with its configured tiles and with larger ones
  (more MMA work per drain: 128 x 256, 256 x 128, 8 warps, 3 and 4 stages);
* cuBLASLt's int8 GEMM (``torch._int_mm``) with the scales, outlier columns and cast as PyTorch ops
  after it (what a dispatch to it would run), and alone (``int_mm_alone``, microseconds: not a whole linear).

    python tools/bench_prefill_gemm.py OUT.json
"""
import json
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from laquant.kernels.gemm.configs import tiled_config
from laquant.kernels.gemm.int8 import int8_gemm, quantize_rows

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from sweep_gemm import SHAPES, make_weights, reference, rel  # noqa: E402

MS = (512, 2048, 4096, 8192)
TILES = [dict(BM=128, BN=256, BK=128, GROUP_M=8, num_warps=8, num_stages=3),
         dict(BM=256, BN=128, BK=128, GROUP_M=8, num_warps=8, num_stages=3),
         dict(BM=128, BN=256, BK=64, GROUP_M=8, num_warps=8, num_stages=4),
         dict(BM=128, BN=128, BK=128, GROUP_M=8, num_warps=8, num_stages=4)]


def int_mm_linear(xq, xs, xo, p):
    """``torch._int_mm`` then the epilogue as PyTorch ops, in the tiled kernel's order."""
    acc = torch._int_mm(xq, p.qweight.t())
    y = acc.float() * xs[:, None] * p.scale[None, :]
    if p.outlier_idx.numel():
        y += xo[:, :p.outlier_idx.numel()].float() @ p.outlier_weight.float().t()
    return y.to(torch.bfloat16)


@torch.no_grad()
def main(out_path: str) -> None:
    dev = "cuda"
    rows = []
    for N, K in SHAPES:
        (p,), keep = make_weights(N, K, 1, dev)
        w_bf16 = reference(torch.eye(K, device=dev), p, keep).t().contiguous().bfloat16()  # the same weight in bf16
        for M in MS:
            x = torch.randn(M, K, device=dev).bfloat16()
            ref = reference(x, p, keep)
            xq, xs, xo = quantize_rows(x, p)
            y = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
            flops = 2 * M * N * K
            row = {"N": N, "K": K, "M": M}
            row["cublas_bf16_us"] = do_bench(lambda: F.linear(x, w_bf16), return_mode="median") * 1e3
            for name, cfg in [("tiled_table", tiled_config(M))] + [(f"tiled_{i}", c) for i, c in enumerate(TILES)]:
                try:
                    int8_gemm(xq, xs, xo, p, y, cfg)
                    if rel(y, ref) > 2e-2:
                        row[name + "_us"] = f"wrong (rel {rel(y, ref):.3g})"
                        continue
                    row[name + "_us"] = do_bench(lambda: int8_gemm(xq, xs, xo, p, y, cfg), return_mode="median") * 1e3
                except Exception as exc:  # out of resources for this tile
                    row[name + "_us"] = f"failed: {type(exc).__name__}"
            err = rel(int_mm_linear(xq, xs, xo, p), ref)
            if err < 2e-2:
                row["int_mm_epilogue_us"] = do_bench(lambda: int_mm_linear(xq, xs, xo, p), return_mode="median") * 1e3
                row["int_mm_alone"] = do_bench(lambda: torch._int_mm(xq, p.qweight.t()), return_mode="median") * 1e3
            else:
                row["int_mm_epilogue_us"] = f"wrong (rel {err:.3g})"
            row["tops_bf16"] = flops / row["cublas_bf16_us"] / 1e6
            # whole linears only (torch._int_mm alone leaves the scales undone)
            best = min((v, k) for k, v in row.items() if k.endswith("_us") and isinstance(v, float) and k != "cublas_bf16_us")
            row["best"], row["best_vs_bf16"] = best[1], row["cublas_bf16_us"] / best[0]
            rows.append(row)
            print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
