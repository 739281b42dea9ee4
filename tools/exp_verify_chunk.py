"""The verify step's cost against a decode step at the e2e models' state shapes (issue #19): GLA's (the 1.37B GLA:
16 heads, K 64, V 128) and the gated delta rule's (qwen3_next-style: 16 key heads, 32 value heads of 128 x 128), B = 64
(or --batch), 4 and 8 tokens, CUDA-graph medians: one decode step, the verify step with numerics "decode" and
"prefill" at the table's launch, and "prefill" over a few launches (V blocks x warps). Run it on two checkouts
(PYTHONPATH) to compare kernels in one job.

    python tools/exp_verify_chunk.py OUT.json [--batch 64] [--formats int8_row:stochastic bf16] [--once]
    (--once: one launch of each, for ncu)
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from sweep_kernels import STATE_SHAPES

from laquant.kernels.common.state import StateQuantizer
from laquant.kernels.delta.decode import delta_decode_step
from laquant.kernels.delta.verify import delta_verify
from laquant.kernels.gla.decode import gla_decode_step
from laquant.kernels.gla.verify import gla_verify

LAUNCHES = [(bv, w) for bv in (32, 64, 128) for w in (4, 8)]


def _flag(name, default):
    return sys.argv[sys.argv.index(name) + 1:] if name in sys.argv else default


def main():
    once = "--once" in sys.argv
    out = sys.argv[1] if not once else None
    batch = int(_flag("--batch", ["64"])[0])
    formats = [f for f in _flag("--formats", ["int8_row:stochastic", "bf16"]) if not f.startswith("--")]
    if once:
        bench = lambda fn: (fn(), torch.cuda.synchronize())[1]  # noqa: E731
    else:
        from triton.testing import do_bench_cudagraph

        bench = lambda fn: do_bench_cudagraph(fn, rep=50) * 1e3  # noqa: E731
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for kernel in ("gla", "delta"):
        Hk, H, K, V = STATE_SHAPES[kernel]
        for name in formats:
            fmt, _, rounding = name.partition(":")
            quant = StateQuantizer(fmt, rounding=rounding or "nearest")
            data, scale = StateQuantizer(fmt).store(torch.randn(batch, H, K, V, device="cuda", generator=gen) * 0.1)
            scale = scale.squeeze(-1).contiguous() if scale is not None else None
            idx = torch.arange(batch, device="cuda", dtype=torch.int32)
            n_stores = torch.zeros(batch, device="cuda", dtype=torch.int32)
            for T in (4, 8):
                q, k = (torch.randn(batch, T, Hk, K, device="cuda", generator=gen).bfloat16() for _ in range(2))
                v = torch.randn(batch, T, H, V, device="cuda", generator=gen).bfloat16()
                if kernel == "gla":
                    g = (F.logsigmoid(torch.randn(batch, T, H, K, device="cuda", generator=gen)) / 16).bfloat16()
                    ins, kw, step, verify = (q, k, v, g), {}, gla_decode_step, gla_verify
                else:
                    g = -F.softplus(torch.randn(batch, T, H, device="cuda", generator=gen))
                    ins = (q, k, v, g, torch.rand(batch, T, H, device="cuda", generator=gen))
                    kw, step, verify = {"use_qk_l2norm": True}, delta_decode_step, delta_verify
                pool = (data.clone(), None if scale is None else scale.clone(), idx, quant, n_stores)
                row = dict(kernel=kernel, format=name, B=batch, Hk=Hk, H=H, K=K, V=V, tokens=T)
                row["decode_us"] = bench(lambda: step(*[x[:, 0] for x in ins], *pool, **kw))
                row["verify_decode_us"] = bench(lambda: verify(*ins, *pool, **kw))
                row["verify_prefill_us"] = bench(lambda: verify(*ins, *pool, numerics="prefill", **kw))
                for bv, w in LAUNCHES:
                    row[f"prefill_bv{bv}_w{w}_us"] = bench(lambda: verify(*ins, *pool, numerics="prefill", block_v=bv,
                                                                          num_warps=w, **kw))
                if not once:
                    row["verify_prefill_over_decode"] = row["verify_prefill_us"] / row["decode_us"]
                    row["best_prefill_over_decode"] = min(v for key, v in row.items()
                                                          if key.startswith("prefill_bv")) / row["decode_us"]
                    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                          flush=True)
                rows.append(row)
    if out:
        json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
