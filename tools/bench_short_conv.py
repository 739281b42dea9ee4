"""A prompt's short conv: the model's PyTorch path (the gather of the conv's columns, the cat with the kept inputs,
PyTorch's depthwise conv, the activation, the kept inputs' slice) against the one-launch kernel
(``laquant.kernels.conv.short_conv.short_conv_triton``), through ``laquant.models.hybrid_mixers.short_conv`` as a
model layer calls it, at released layers' shapes. Outputs and kept inputs checked first; CUDA-graph medians.

    python tools/bench_short_conv.py --out DIR [--tokens 512,1024,4096]
    TRITON_INTERPRET=1 python tools/bench_short_conv.py --smoke      # tiny shapes through both paths, on the CPU
"""
import argparse
import json
import os
from unittest import mock

import torch
import torch.nn as nn

from laquant.models import hybrid_mixers

# name -> (projection width N, conv channels C gathered from it (None: all of N), width W, the gathered columns:
# "grouped" as qwen3_next's in_proj_qkvz holds them, per key head q, k, then its value heads, each head 128
# columns (runs the kernel reads as one), "scattered" sorted random columns (the kernel's gather))
SHAPES = {
    "qwen3_next 1.14B (q, k, v out of in_proj_qkvz)": (12288, 8192, 4, "grouped"),
    "the same widths, scattered columns": (12288, 8192, 4, "scattered"),
    "Nemotron-H / Mamba2 xBC": (6144, None, 4, None),
    "Kimi Linear KDA q, k, v": (12288, None, 4, None),
}


def grouped_columns(key_heads: int = 16, head: int = 128, values_per_key: int = 2) -> torch.Tensor:
    """qwen3_next's conv columns (``Qwen3NextGatedDeltaNet``'s ``conv_columns``): per key head a group of q, k, its
    value heads and their z heads, each ``head`` wide; the conv reads every q, then every k, then every v."""
    group = (2 + 2 * values_per_key) * head
    starts = ([g * group for g in range(key_heads)] + [g * group + head for g in range(key_heads)]
              + [g * group + 2 * head + i * head for g in range(key_heads) for i in range(values_per_key)])
    return torch.cat([torch.arange(s, s + head) for s in starts]).to(torch.int32)


class _Store:
    def __init__(self):
        self.conv, self.static = {}, False


def _case(N, C, W, B, T, device, dtype, gen, columns=None):
    C = C or N
    conv = nn.Conv1d(C, C, W, groups=C, bias=False, padding=W - 1).to(device, dtype)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(C, 1, W, generator=gen).to(device, dtype) * 0.5)
    x = torch.randn(B, T, N, generator=gen).to(device, dtype)
    if columns == "grouped":
        cols = grouped_columns()
        # the last group's z heads lie past the last v column: the columns end before N
        assert cols.numel() == C and int(cols.max()) < N, "the grouped layout is qwen3_next's 1.14B widths"
    else:
        cols = None if C == N else torch.randperm(N, generator=gen)[:C].sort().values
    return conv, x, None if cols is None else cols.to(device, torch.int32)


def run(conv, x, cols, kernel: bool):
    """``short_conv`` as a layer's prompt calls it, by the kernel or by the PyTorch path; (out, kept)."""
    store = _Store()
    with mock.patch.object(hybrid_mixers, "_one_kernel_prompt", lambda *a: kernel), torch.no_grad():
        out = hybrid_mixers.short_conv(x, store, 0, conv, "silu", cols)
    return out, store.conv[0]


def smoke() -> None:
    gen = torch.Generator().manual_seed(0)
    for N, C, W in ((40, 24, 4), (32, None, 3)):
        conv, x, cols = _case(N, C, W, 2, 9, "cpu", torch.float32, gen)
        (a, ka), (b, kb) = run(conv, x, cols, False), run(conv, x, cols, True)
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6) and torch.equal(ka, kb)
    print("short conv: the kernel path equals the PyTorch path")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--tokens", default="512,1024,4096")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    from triton.testing import do_bench_cudagraph

    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, (N, C, W, columns) in SHAPES.items():
        for T in [int(t) for t in args.tokens.split(",")]:
            conv, x, cols = _case(N, C, W, 1, T, "cuda", torch.bfloat16, gen, columns)
            (a, ka), (b, kb) = run(conv, x, cols, False), run(conv, x, cols, True)
            rec = dict(layer=name, N=N, C=C or N, W=W, tokens=T, rel_err=((a.float() - b.float()).norm()
                       / a.float().norm()).item(), kept_equal=bool(torch.equal(ka, kb)))
            for label, kernel in (("pytorch", False), ("kernel", True)):
                rec[f"{label}_us"] = do_bench_cudagraph(lambda k=kernel: run(conv, x, cols, k), rep=20) * 1e3
            rec["speedup"] = rec["pytorch_us"] / rec["kernel_us"]
            rec["bytes_MB"] = (T * (C or N) * 2 * 2) / 1e6  # read and written once, bf16
            rec["kernel_GBps"] = rec["bytes_MB"] * 1e3 / rec["kernel_us"]
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    with open(os.path.join(args.out, "short_conv.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
    lines = ["| layer | tokens | PyTorch path us | kernel us | speedup | kernel GB/s (in + out) | rel err "
             "| kept equal |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['layer']} | {r['tokens']} | {r['pytorch_us']:.1f} | {r['kernel_us']:.1f} | {r['speedup']:.2f}x | "
              f"{r['kernel_GBps']:.0f} | {r['rel_err']:.1e} | {r['kept_equal']} |" for r in rows]
    with open(os.path.join(args.out, "short_conv.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
