"""What the outlier columns cost the int8 GEMMs, by their number.

The hybrid_int8 prefill of the 1.14B qwen3_next spent 5.0 ms in 64 tiled GEMM launches where the
tiles' sweep (8 outlier columns) predicts ~2.7 ms; calibrated on random tokens, its down_proj keeps
~270 of 5,632 input columns in bf16. For N x K in {2048x5632 (down_proj), 2048x2048}, M in
{1, 64, 1024, 4096} and 0 / 8 / 64 / 270 outlier columns: the GEMM on pre-made codes at the table's
tiles (split-K at M <= 256, tiled above), with the outlier block as ``PackedOutlierWeight.pack`` now
lays it out (padded to a multiple of 16 columns) and as it was (``unpadded``). CUDA-graph medians,
checked against a float32 reference.

    python tools/probe_gemm_outliers.py OUT.json
"""
import dataclasses
import json
import sys

import sweep_gemm
import torch
import triton
from sweep_gemm import bench, make_weights, reference, rel

from laquant.kernels.gemm.configs import choose_config
from laquant.kernels.gemm.int8 import int8_gemm, quantize_rows


def main(out_path: str) -> None:
    dev = torch.device("cuda")
    rows = []
    for (N, K) in ((2048, 5632), (2048, 2048)):
        for n_out in (0, 8, 64, 100, 256, 270):
            sweep_gemm.N_OUT = n_out
            packs, keep_idx = make_weights(N, K, 1, dev)
            p = packs[0]
            n_packed = p.outlier_idx.numel()  # padded to OUTLIER_ALIGN by PackedOutlierWeight.pack
            unpadded = dataclasses.replace(p, outlier_idx=p.outlier_idx[:n_out].contiguous(),
                                           outlier_weight=p.outlier_weight[:, :n_out].contiguous())
            for M in (1, 64, 1024, 4096):
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                x[:, p.outlier_idx.long()] *= 30
                ref = reference(x, unpadded, keep_idx)
                y = torch.empty(M, N, device=dev, dtype=x.dtype)
                cfg = choose_config("w8a8", M, N, K, torch.cuda.get_device_name(dev))
                rec = dict(N=N, K=K, M=M, n_outliers=n_out, n_packed=n_packed, config=cfg)
                for label, q in (("padded", p), ("unpadded", unpadded)):
                    codes = quantize_rows(x, q)
                    int8_gemm(*codes, q, y, cfg)
                    rec[f"{label}_rel_err"] = rel(y.clone(), ref)
                    rec[f"{label}_us"] = bench(lambda: int8_gemm(*codes, q, y, cfg))  # noqa: B023
                rows.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "config"}), flush=True)
    with open(out_path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
