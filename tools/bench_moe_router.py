"""A MoE router's forward: transformers' own (its GEMM, then 6-15 PyTorch operations) against laquant's fused one (the
same GEMM, then one Triton launch: laquant/models/fused_moe.py), on the router shapes of released MoE models, T = 1,
64 and 1,024 tokens; GPU time of a CUDA graph of one call (triton.testing.do_bench_cudagraph), the router's GEMM
alone beside them, and the fused routing checked against transformers' (fused_moe.routing_agrees) first.

    python3 tools/bench_moe_router.py OUT.json          (GPU; without one, a smoke run: the Triton interpreter, small
                                                         T, wall-clock times that mean nothing)
"""
import json
import os
import sys
import time
import types

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

from laquant.models import fused_moe  # noqa: E402
from laquant.models.quantizing_rowwise import mix_into  # noqa: E402
# name: (transformers module, router class, hidden, experts, top-k, grouped routing's (groups, kept groups, scale))
ROUTERS = {
    "qwen3_next_80b_a3b": ("qwen3_next", "Qwen3NextTopKRouter", 2048, 512, 10, None),
    "minimax_text_01": ("minimax", "MiniMaxTopKRouter", 6144, 32, 2, None),
    "granite_4_h_small": ("granitemoehybrid", "GraniteMoeHybridTopKRouter", 4096, 72, 10, None),
    "kimi_linear_48b_a3b": ("kimi_linear", "KimiLinearTopkRouter", 2304, 256, 8, (1, 1, 2.446)),
    "ling_2_grouped": ("bailing_hybrid", "BailingHybridTopkRouter", 2048, 256, 8, (8, 4, 2.5)),
}
TOKENS = (1, 64, 1024) if CUDA else (1, 5)
DTYPE = torch.bfloat16 if CUDA else torch.float32


def router(module: str, cls_name: str, hidden: int, experts: int, top_k: int, grouped):
    """The transformers router class with random weights (and a random choice bias where grouped), or None where this
    transformers lacks it."""
    import importlib

    try:
        cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), cls_name)
    except (ImportError, AttributeError):
        return None
    n_group, topk_group, scale = grouped or (1, 1, 1.0)
    config = types.SimpleNamespace(hidden_size=hidden, num_experts=experts, num_local_experts=experts,
                                   num_experts_per_tok=top_k, norm_topk_prob=True, routed_scaling_factor=scale,
                                   n_group=n_group, topk_group=topk_group)
    r = cls(config).to("cuda" if CUDA else "cpu")
    with torch.no_grad():
        r.weight.copy_(torch.randn_like(r.weight, dtype=torch.float32) / hidden ** 0.5)
        if hasattr(r, "e_score_correction_bias"):
            r.e_score_correction_bias.copy_(torch.randn_like(r.e_score_correction_bias) * 0.1)
    return r.to(DTYPE) if not hasattr(r, "e_score_correction_bias") else r


def timed_ms(fn) -> float:
    if CUDA:
        import triton

        return triton.testing.do_bench_cudagraph(fn)
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


@torch.no_grad()
def main(out_path: str):
    if not CUDA:
        fused_moe.use_triton = lambda x: True  # the smoke run: the fused path interpreted on the CPU
    rows = []
    for name, (module, cls_name, hidden, experts, top_k, grouped) in ROUTERS.items():
        r = router(module, cls_name, hidden, experts, top_k, grouped)
        if r is None:
            print(f"{name}: this transformers has no {cls_name}", flush=True)
            continue
        mix_into([r], fused_moe._FusedRouting, fused_moe.ROUTERS)
        for T in TOKENS:
            x = torch.randn(T, hidden, device=r.weight.device, dtype=DTYPE)
            fused_moe._CHECKED.pop(type(r)._laquant_base, None)
            ours = r(x)  # the first-use check
            agrees = fused_moe._CHECKED[type(r)._laquant_base]
            row = dict(router=name, cls=cls_name, hidden=hidden, experts=experts, top_k=top_k, grouped=grouped,
                       tokens=T, agrees=agrees, outputs=len(ours),
                       transformers_ms=round(timed_ms(lambda: type(r)._laquant_base.forward(r, x)), 4),
                       fused_ms=round(timed_ms(lambda: r(x)), 4),
                       gemm_ms=round(timed_ms(lambda: torch.nn.functional.linear(x.to(r.weight.dtype), r.weight)), 4))
            row["speedup"] = round(row["transformers_ms"] / row["fused_ms"], 2)
            rows.append(row)
            print(row, flush=True)
    device = torch.cuda.get_device_name() if CUDA else "cpu (smoke run)"
    import transformers

    with open(out_path, "w") as f:
        json.dump(dict(device=device, torch=torch.__version__, transformers=transformers.__version__,
                       dtype=str(DTYPE), rows=rows), f, indent=1)
    md = [f"# MoE routers: transformers' forward against laquant's fused one ({device}, {DTYPE})", "",
          "| router | experts / top-k | T | transformers ms | fused ms | speedup | its GEMM alone ms | agrees |",
          "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['router']} | {r['experts']} / {r['top_k']} | {r['tokens']} | {r['transformers_ms']} | "
           f"{r['fused_ms']} | {r['speedup']}x | {r['gemm_ms']} | {r['agrees']} |" for r in rows]
    with open(out_path.rsplit(".", 1)[0] + ".md", "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
