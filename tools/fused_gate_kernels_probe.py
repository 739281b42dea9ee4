"""The kernels of GLA's fused low-rank gate alone (issue #14), H = 16 heads of 64 x 128, 2048 wide, int8 state
(stochastic), at B = 1 and 64: the norm writing the q/k/v/g GEMM's codes with and without the gate's rank-16
intermediate, the decode step (output norm and o_proj's codes) reading g or finishing the gate itself, and the gate's
own kernel. CUDA-graph medians (``do_bench_cudagraph``), us.

    python3 tools/fused_gate_kernels_probe.py OUT.json
"""
import json
import sys

import torch
import torch.nn as nn
from triton.testing import do_bench_cudagraph

from laquant.kernels.common.state import StateQuantizer
from laquant.kernels.gla.decode import gla_decode_step
from laquant.kernels.gla.gate import LowRankDecay, low_rank_gate_log_decay_triton
from laquant.kernels.rowwise.fused import rms_norm_triton
from laquant.quant.modules import QuantGate, QuantLinear


def main(out: str) -> None:
    H, K, V, N, R = 16, 64, 128, 2048, 16
    dt = torch.bfloat16
    none = torch.zeros(0, dtype=torch.long)
    gate = QuantGate(QuantLinear.from_linear(nn.Linear(N, R, bias=False).to(dt), none, act_granularity="none"),
                     QuantLinear.from_linear(nn.Linear(R, H * K).to(dt), none, act_granularity="none"),
                     n_channels=H * K, scaling="per_channel")
    gate.calibrate(-torch.rand(H * K) * 4 - 1, torch.rand(H * K) * 2)
    gate = gate.cuda()
    first, second = gate[0].packed(), gate[1].packed()
    treatment = gate.logit_treatment()
    qkv = QuantLinear.from_linear(nn.Linear(N, 6144).to(dt), none).cuda().packed()
    o_proj = QuantLinear.from_linear(nn.Linear(H * V, N).to(dt), none).cuda().packed()
    quant = StateQuantizer("int8_row", 1, None, rounding="stochastic")
    rows = []
    for B in (64, 1):
        x, res = (torch.randn(B, 1, N, device="cuda", dtype=dt) for _ in range(2))
        w = torch.randn(N, device="cuda", dtype=dt)
        q, k = (torch.randn(B, H, K, device="cuda", dtype=dt) for _ in range(2))
        v, z = (torch.randn(B, H, V, device="cuda", dtype=dt) for _ in range(2))
        g = (torch.nn.functional.logsigmoid(torch.randn(B, H, K, device="cuda")) / 16)
        data, scale = quant.store(torch.randn(B, H, K, V, device="cuda"))
        scale = scale.squeeze(-1).expand(B, H, K).contiguous()
        idx = torch.arange(B, dtype=torch.int32, device="cuda")
        ns = torch.zeros(B, dtype=torch.int32, device="cuda")
        nw = torch.randn(V, device="cuda", dtype=dt)
        h = torch.randn(B, R, device="cuda", dtype=dt)
        decay = LowRankDecay(h, second, 16, None, **treatment)
        cases = {
            "norm_codes": lambda: rms_norm_triton(x, w, 1e-6, res, packed=qkv, round_sum=True),
            "norm_codes_low_rank": lambda: rms_norm_triton(x, w, 1e-6, res, packed=qkv, round_sum=True,
                                                           low_rank=first),
            "gate_kernel": lambda: low_rank_gate_log_decay_triton(x, first, second, 16, None, **treatment),
            "decode_g": lambda: gla_decode_step(q, k, v, g, data, scale, idx, quant, ns, norm=(z, nw, 1e-5),
                                                packed=o_proj),
            "decode_gate": lambda: gla_decode_step(q, k, v, None, data, scale, idx, quant, ns, norm=(z, nw, 1e-5),
                                                   packed=o_proj, gate=decay),
        }
        for name, fn in cases.items():
            fn()
            torch.cuda.synchronize()
            us = do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3
            rows.append(dict(batch=B, case=name, us=round(us, 2)))
            print(json.dumps(rows[-1]), flush=True)
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
