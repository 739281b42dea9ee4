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

from sweep_kernels import STATE_SHAPES, state_pool, verify_inputs

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
            data, scale, idx, quant, n_stores = state_pool(name, batch, H, K, V, gen)
            step, verify = (gla_decode_step, gla_verify) if kernel == "gla" else (delta_decode_step, delta_verify)
            for T in (4, 8):
                ins, kw = verify_inputs(kernel, batch, T, Hk, H, K, V, gen)
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
