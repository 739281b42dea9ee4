"""The int8-state decode kernels alone (issue #14), at the e2e models' heads: GLA's (16 heads of 64 x 128) and the
gated delta rule's (qwen3_next's: 16 key / 32 value heads of 128 x 128), per-row int8 state with stochastic rounding
(the hybrid_int8 / gla_int8_all state), the table's launch, B = 1, 16, 64; CUDA-graph medians, us. Run it on two
checkouts (PYTHONPATH) to compare them.

    python3 tools/decode_step_probe.py OUT.json
"""
import json
import sys

import torch
from triton.testing import do_bench_cudagraph

import laquant
from laquant.kernels.common.state import StateQuantizer
from laquant.kernels.delta.decode import delta_decode_step
from laquant.kernels.gla.decode import gla_decode_step


def main(out: str) -> None:
    dt = torch.bfloat16
    quant = StateQuantizer("int8_row", 1, None, rounding="stochastic")
    initial = StateQuantizer("int8_row")  # the starting states (rounded to nearest)
    rows = []
    for B in (64, 16, 1):
        idx, ns = torch.arange(B, dtype=torch.int32, device="cuda"), torch.zeros(B, dtype=torch.int32, device="cuda")
        H, K, V = 16, 64, 128
        q, k = (torch.randn(B, H, K, device="cuda", dtype=dt) for _ in range(2))
        g = torch.nn.functional.logsigmoid(torch.randn(B, H, K, device="cuda")) / 16
        v = torch.randn(B, H, V, device="cuda", dtype=dt)
        data, scale = initial.store(torch.randn(B, H, K, V, device="cuda"))
        scale = scale.squeeze(-1).contiguous()
        cases = {"gla": lambda: gla_decode_step(q, k, v, g, data, scale, idx, quant, ns)}
        Hk, Hv, K2 = 16, 32, 128
        q2, k2 = (torch.randn(B, Hk, K2, device="cuda", dtype=dt) for _ in range(2))
        v2 = torch.randn(B, Hv, V, device="cuda", dtype=dt)
        g2, beta = -torch.rand(B, Hv, device="cuda"), torch.rand(B, Hv, device="cuda")
        data2, scale2 = initial.store(torch.randn(B, Hv, K2, V, device="cuda"))
        scale2 = scale2.squeeze(-1).contiguous()
        cases["delta"] = lambda: delta_decode_step(q2, k2, v2, g2, beta, data2, scale2, idx, quant, ns,
                                                   use_qk_l2norm=True)
        for name, fn in cases.items():
            fn()
            torch.cuda.synchronize()
            us = do_bench_cudagraph(fn, rep=300, return_mode="median") * 1e3
            rows.append(dict(kernel=name, batch=B, us=round(us, 2)))
            print(json.dumps(rows[-1]), flush=True)
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "laquant": laquant.__file__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
