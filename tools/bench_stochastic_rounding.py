"""Decode-kernel time with nearest vs stochastic rounding of the 8-bit states (GLA and the gated
delta rule, B = 64, H = 64, K = V = 128 as in eval/results/speed.md), and the kernels' random bits
against the PyTorch reference's on odd shapes. GPU only.

    python tools/bench_stochastic_rounding.py --out eval/results/stochastic_rounding_h100
writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from laquant.kernels.common.state import StateQuantizer, state_random_bytes
from laquant.kernels.common.triton_numerics import state_random_bytes as state_random_bytes_tl
from laquant.kernels.delta.decode import delta_decode_step
from laquant.kernels.gla.decode import gla_decode_step


def _pool(B, H, K, V, fmt, gen):
    full = torch.randn(B, H, K, V, device="cuda", generator=gen)
    data, scale = StateQuantizer(fmt).store(full)
    return data, None if scale is None else scale.squeeze(-1).contiguous()


def time_decode(kernel: str, fmt: str, rounding: str, B=64, H=64, K=128, V=128) -> float:
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen, dtype=torch.bfloat16)  # noqa: E731
    data, scale = _pool(B, H, K, V, fmt, gen)
    idx = torch.arange(B, dtype=torch.int32, device="cuda")
    n_stores = torch.zeros(B, dtype=torch.int32, device="cuda")
    quant = StateQuantizer(fmt, 1, rounding=rounding)
    if kernel == "gla":
        q, k, v = r(B, H, K), r(B, H, K), r(B, H, V)
        g = torch.nn.functional.logsigmoid(r(B, H, K).float()).to(torch.bfloat16)
        fn = lambda: gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores, seed=1)  # noqa: E731
    else:
        q, k, v = r(B, H, K), r(B, H, K), r(B, H, V)
        g = torch.nn.functional.logsigmoid(r(B, H).float()).to(torch.bfloat16)
        beta = torch.rand(B, H, device="cuda", generator=gen).to(torch.bfloat16)
        fn = lambda: delta_decode_step(q, k, v, g, beta, data, scale, idx, quant, n_stores,  # noqa: E731
                                       use_qk_l2norm=True, seed=1)
    fn()
    return triton.testing.do_bench_cudagraph(fn, rep=200) * 1000.0  # µs


@triton.jit
def _bytes_kernel(out, seed, slot, position, sub, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr):
    h = tl.program_id(0)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    r = state_random_bytes_tl(seed, tl.full([], slot, tl.int64), tl.full([], position, tl.int32), sub, h, offs_k, 0,
                              K, V, BK, BV)
    mask = (offs_k < K)[:, None] & (offs_v < V)[None, :]
    tl.store(out + (h * K + offs_k[:, None]) * V + offs_v[None, :], r.to(tl.int32), mask=mask)


def random_bits_equal() -> list[dict]:
    rows = []
    for H, K, V, seed, slot, pos, sub in [(3, 7, 24, 1, 0, 1, 0), (5, 20, 40, 2**40 + 3, 1023, 65537, 3),
                                          (2, 33, 8, 77, 5, 2, 0), (1, 128, 100, 9, 63, 100000, 1),
                                          (4, 64, 128, 12345, 7, 4096, 0)]:
        out = torch.full((H, K, V), -1, dtype=torch.int32, device="cuda")
        _bytes_kernel[(H,)](out, seed, slot, pos, sub, K=K, V=V, BK=triton.next_power_of_2(K),
                            BV=triton.next_power_of_2(V))
        ref = state_random_bytes(seed, torch.tensor([slot], device="cuda"), pos, sub, (1, H, K, V))[0]
        rows.append(dict(shape=[H, K, V], seed=seed, slot=slot, position=pos, sub=sub,
                         equal=bool(torch.equal(out.long(), ref)), elements=out.numel()))
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = []
    for kernel in ("gla", "delta"):
        for fmt in ("fp8_row", "int8_row"):
            t = {rd: time_decode(kernel, fmt, rd) for rd in ("nearest", "stochastic")}
            rows.append(dict(kernel=kernel, format=fmt, nearest_us=t["nearest"], stochastic_us=t["stochastic"],
                             ratio=t["stochastic"] / t["nearest"]))
            print(rows[-1], flush=True)
    bits = random_bits_equal()
    payload = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   shape=dict(B=64, H=64, K=128, V=128), decode=rows, random_bits=bits)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [f"# Stochastic rounding: decode-kernel time and random bits ({payload['device']})", "",
             "Decode step, B = 64, H = 64, K = V = 128, state in place on a pool, bf16 inputs; "
             "`triton.testing.do_bench_cudagraph` (µs).", "",
             "| kernel | format | nearest µs | stochastic µs | stochastic / nearest |", "|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['format']} | {r['nearest_us']:.1f} | {r['stochastic_us']:.1f} | {r['ratio']:.3f} |"
              for r in rows]
    lines += ["", "Kernel random bytes (`triton_numerics.state_random_bytes`) against the PyTorch Philox "
              "(`kernels/common/state.state_random_bytes`), odd shapes:", "",
              "| [H, K, V] | seed | slot | position | sub | bit-identical |", "|---|---|---|---|---|---|"]
    lines += [f"| {b['shape']} | {b['seed']} | {b['slot']} | {b['position']} | {b['sub']} | {b['equal']} |" for b in bits]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
