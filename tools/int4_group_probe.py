"""Probe (issue #16 stretch): would smaller scale groups bring a 4-bit state within +1.5% of bf16?

Decode-mode perplexity of the embedded gla-small (bf16 compute, state-only quantization, as
``tools/long_context_eval.py``'s ``gla_fp8_state:int4_row:ROUNDING``) with every stored state
fake-quantized to int4 codes in [-7, 7] with one scale per GROUP consecutive elements of a row
(GROUP = V is ``int4_row``; the same Philox bits, so GROUP = V reproduces its numbers). The state
is kept as float32 after the round trip: this measures accuracy only, no format is added.
``--grid e2m1`` rounds to fp4 e2m1's values {0, 0.5, 1, 1.5, 2, 3, 4, 6} (times the scale,
absmax / 6) instead: finer near zero, coarser near the absmax. ``--rotate`` quantizes each row
in a Hadamard basis along V (``S H``, ``H`` orthonormal, back by ``H^T``): the state kept rotated, as
QuaRot keeps a KV cache. The recurrence is linear in S, so a model could keep ``S H`` for good, with
``v`` rotated on the way in and ``o`` rotated back; the rotation spreads a row's large elements over
all of it, so its absmax scale fits the rest better.

    python tools/int4_group_probe.py --groups 64 32 16 --device cpu --max-windows 31
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch

import laquant
from laquant.data import load_text, tokenize
from laquant.eval.ppl import default_stride, perplexity
from laquant.kernels.common.numerics import INT4_MAX, dequantize, quantize_int
from laquant.kernels.common.state import StateQuantizer
from laquant.loading import load_tokenizer, resolve_model_dir


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


class GroupInt4(StateQuantizer):
    """int4_row's rounding with a scale per ``group`` elements of a row; stores the float32 round trip."""

    def __init__(self, group: int, rounding: str, grid: str = "int4", rotate: bool = False):
        super().__init__("int4_row", rounding=rounding)
        self.group, self.grid, self.rotate = group, grid, rotate

    def store(self, state, prev_scale=None, n_stores: int = 0, key=None):
        *lead, V = state.shape
        x = state.float()
        h = hadamard(V, str(x.device)) if self.rotate else None
        if self.rotate:
            x = x @ h
        grouped = x.reshape(*lead, V // self.group, self.group)
        random = key.random_bytes(state.shape).reshape(grouped.shape) if self.stochastic else None
        if self.grid == "e2m1":
            out = _e2m1(grouped, random).reshape(state.shape)
        else:
            q, scale = quantize_int(grouped, INT4_MAX, -1, None, self.rounding, random)
            out = dequantize(q, scale).reshape(state.shape)
        return (out @ h.T if self.rotate else out), None


@functools.lru_cache(maxsize=None)
def hadamard(n: int, device: str) -> torch.Tensor:
    """The orthonormal Sylvester-Hadamard matrix of order ``n`` (a power of two)."""
    if n & (n - 1):
        raise SystemExit(f"--rotate needs V a power of two, got {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n ** 0.5).to(device)


def _e2m1(x, random):
    """``x`` on the e2m1 grid scaled to each group's absmax, stochastically (``random``) or to nearest."""
    scale = x.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 6.0
    y = (x / scale).abs().clamp(max=6.0)
    grid = E2M1.to(x.device)
    hi_i = torch.searchsorted(grid, y.contiguous()).clamp(1, len(grid) - 1)
    lo, hi = grid[hi_i - 1], grid[hi_i]
    frac = (y - lo) / (hi - lo)
    up = frac * 256.0 >= 255.5 - random.float() if random is not None else frac >= 0.5
    return torch.where(up, hi, lo) * torch.sign(x) * scale


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", nargs="+", type=int, default=[32, 16])
    p.add_argument("--rounding", default="stochastic")
    p.add_argument("--grid", default="int4", choices=["int4", "e2m1"])
    p.add_argument("--rotate", action="store_true", help="quantize each row in a Hadamard basis along V")
    p.add_argument("--layers", nargs="+", type=int, default=None,
                   help="only these layers' states in 4 bits (the others float32): per-layer sensitivity")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--max-windows", type=int, default=31)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    model_dir = resolve_model_dir(None)
    ids = tokenize(load_text("wikitext2"), load_tokenizer(model_dir))
    ids = ids[: args.context + (args.max_windows - 1) * default_stride(args.context)]
    model, _ = laquant.load(model_dir, device=args.device, dtype=torch.bfloat16)
    results = []
    for group in args.groups:
        mixers = [m for m in model.modules() if hasattr(m, "state_quantizer")]
        for i, m in enumerate(mixers):
            if args.layers is None or i in args.layers:
                if m.head_v_dim % group:
                    raise SystemExit(f"group {group} does not divide V = {m.head_v_dim}")
                m.state_quantizer = GroupInt4(group, args.rounding, args.grid, args.rotate)
        t0 = time.perf_counter()
        res = perplexity(model, ids, context=args.context, mode="decode", batch_size=64, progress=True)
        row = {"group": group, "grid": args.grid, "rotate": args.rotate, "rounding": args.rounding,
               "layers": args.layers, "ppl": res.ppl, "tokens": len(ids),
               "seconds": time.perf_counter() - t0}
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
