"""Decode-step benchmark: laquant's state-pool kernel (fp8 / bf16 / fp32 state) vs fla's fused_recurrent_gla.

    python -m laquant.eval.bench_decode --out eval/results/bench_decode.json   (needs CUDA; fla optional)

Medians from ``triton.testing.do_bench``; achieved bandwidth counts the state read and written once
plus q, k, v, g, o, against the device's measured copy bandwidth (bytes read + written).
"""

from __future__ import annotations

import argparse
import json

import torch


def copy_bandwidth(nbytes: int = 2**30) -> float:
    from triton.testing import do_bench

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * nbytes / (ms * 1e-3)


def main(argv: list[str] | None = None) -> None:
    from triton.testing import do_bench

    from laquant.kernels.gla_decode_triton import gla_decode_step
    from laquant.quant.state import StateQuantizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 32, 64, 128, 256])
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    H, K = args.heads, args.dim
    V = K
    bw = copy_bandwidth()
    try:
        from fla.ops.gla import fused_recurrent_gla
    except ImportError:
        fused_recurrent_gla = None
    rows = []
    for B in args.batch:
        gen = torch.Generator(device="cuda").manual_seed(B)
        r = lambda *s: torch.randn(*s, device="cuda", generator=gen)
        q, k, v = (r(B, H, K).bfloat16() for _ in range(3))
        g = torch.nn.functional.logsigmoid(r(B, H, K)).bfloat16() / 16
        idx = torch.arange(B, device="cuda", dtype=torch.int32)
        row = {"B": B, "H": H, "K": K, "V": V}
        io_bytes = B * H * (3 * K + 2 * V) * 2  # q, k, g, v in; o out (bf16)
        for fmt in ("fp8_row", "bf16", "fp32"):
            quant = StateQuantizer(fmt)
            data, scale = quant.store(r(B, H, K, V))
            scale = scale.squeeze(-1).contiguous() if scale is not None else None
            ms = do_bench(lambda: gla_decode_step(q, k, v, g, data, scale, idx, quant), warmup=25, rep=200,
                          return_mode="median")
            state_bytes = data.numel() * data.element_size() + (scale.numel() * 4 if scale is not None else 0)
            nbytes = 2 * state_bytes + io_bytes
            row[f"laquant_{fmt}_us"] = ms * 1e3
            row[f"laquant_{fmt}_GBps"] = nbytes / (ms * 1e-3) / 1e9
            row[f"laquant_{fmt}_floor_us"] = nbytes / bw * 1e6
        if fused_recurrent_gla is not None:
            h0 = r(B, H, K, V)
            q4, k4, v4, g4 = (x.unsqueeze(1) for x in (q, k, v, g))
            ms = do_bench(lambda: fused_recurrent_gla(q4, k4, v4, g4, initial_state=h0, output_final_state=True),
                          warmup=25, rep=200, return_mode="median")
            row["fla_fp32_us"] = ms * 1e3
            row["speedup_fp8_vs_fla"] = row["fla_fp32_us"] / row["laquant_fp8_row_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    import triton

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_bandwidth_GBps": bw / 1e9, "dtype_inputs": "bfloat16", "rows": rows}
    try:
        import fla

        result["fla"] = fla.__version__
    except ImportError:
        pass
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    for row in rows:
        line = (f"B={row['B']:>4} fp8 {row['laquant_fp8_row_us']:7.1f} us ({row['laquant_fp8_row_GBps']:5.0f} GB/s, "
                f"floor {row['laquant_fp8_row_floor_us']:6.1f})  bf16 {row['laquant_bf16_us']:7.1f}  "
                f"fp32 {row['laquant_fp32_us']:7.1f}")
        if "fla_fp32_us" in row:
            line += f"  fla {row['fla_fp32_us']:7.1f}  fp8/fla {row['speedup_fp8_vs_fla']:.2f}x"
        print(line)


if __name__ == "__main__":
    main()
