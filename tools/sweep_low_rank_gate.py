"""Tile sweep of the fused low-rank gate (kernels/gla/gate.py, ``low_rank_gate_log_decay_triton``) for GLA's
``gk_proj`` at the widths of the models benchmarked: hidden 2048 -> 16 -> 1024 (the 1.37B GLA) and 4096 -> 16 -> 2048
(the 6.9B one), at M = 1 and 64 tokens. CUDA-graph median (``do_bench_cudagraph``) over 32 distinct gates, each
candidate's output checked against the default config's first (a different one is dropped).

    python tools/sweep_low_rank_gate.py --out DIR    # DIR/low_rank_gate_<device>.json and .md
"""
import argparse
import itertools
import json
import os

import torch
import triton
from sweep_gemm import bench, rotating  # this folder's: CUDA-graph median over rotated inputs

from laquant.kernels.gla.gate import low_rank_gate_config, low_rank_gate_log_decay_triton
from laquant.quant.modules import QuantLinear

GATES = [(2048, 16, 1024), (4096, 16, 2048)]
MS = (1, 64)


def gates(K, R, C, n, dev):
    out, none = [], torch.zeros(0, dtype=torch.long)
    for i in range(n):
        torch.manual_seed(i)
        first = QuantLinear.from_linear(torch.nn.Linear(K, R, bias=False).bfloat16(), none, act_granularity="none")
        second = QuantLinear.from_linear(torch.nn.Linear(R, C).bfloat16(), none, act_granularity="none")
        out.append((first.to(dev).packed(), second.to(dev).packed()))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    rows = []
    for (K, R, C), M in itertools.product(GATES, MS):
        packs = gates(K, R, C, 32, dev)
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        default = low_rank_gate_config(M, x.dtype)
        want = low_rank_gate_log_decay_triton(x, *packs[0], 16.0)

        def timed(cfg):  # noqa: B023 (x, packs: this shape's)
            return bench(rotating(lambda p: low_rank_gate_log_decay_triton(x, *p, 16.0, config=cfg), packs))

        results = []
        for rws, bc, bk, warps, stages in itertools.product((16, 32, 64), (16, 32, 64), (256, 512, 1024),
                                                             (4, 8), (2, 3)):
            if rws > max(16, triton.next_power_of_2(M)):
                continue
            cfg = dict(ROWS=rws, BLOCK_C=bc, BK=bk, num_warps=warps, num_stages=stages)
            try:
                if not torch.equal(low_rank_gate_log_decay_triton(x, *packs[0], 16.0, config=cfg), want):
                    continue
                us = timed(cfg)
            except Exception:  # noqa: BLE001 (out of shared memory, ...)
                continue
            results.append((us, cfg))
        results.sort(key=lambda r: r[0])
        d_us = timed(default)
        row = dict(K=K, R=R, C=C, M=M, default=default, default_us=d_us, best=results[0][1], best_us=results[0][0],
                   top5=[dict(us=u, **c) for u, c in results[:5]])
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    slug = name.split()[-1].lower() if "H" in name else name.lower().replace(" ", "_")
    meta = dict(device=name, torch=torch.__version__, triton=triton.__version__, x="bf16 [M, K]",
                gate="QuantLinear K -> R (W8A16, no bias) then R -> C (W8A16, bias), tail without calibrated bounds",
                timing="do_bench_cudagraph(rep=5) median, 32 distinct gates rotated")
    with open(os.path.join(args.out, f"low_rank_gate_{slug}.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    lines = [f"# Fused low-rank gate tiles: {name}", "", "| K -> R -> C | M | default us | best us | best |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['K']} -> {r['R']} -> {r['C']} | {r['M']} | {r['default_us']:.2f} | {r['best_us']:.2f} | "
              f"{r['best']} |" for r in rows]
    with open(os.path.join(args.out, f"low_rank_gate_{slug}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
