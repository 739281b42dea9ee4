"""Kernels and GPU time of one decode step and one prefill of a random GLA, bf16 and quantized.

The before/after counts of issue #14 (``eval/results/speed_h100_e2e_fused.md``) come from this
script, run on the tree before and after the change in one device call:

    python tools/profile_step.py OUT.json [LAYERS] [HIDDEN]

For bf16, gla_int8 and gla_int8_all, it measures:
- one eager B=64 decode step after a 512-token prompt, under torch.profiler: CUDA kernels per step
  and per layer, GPU ms, the top kernels;
- graphed decode ms per step at B=1 and B=64;
- the profile and tokens/s of a 4,096-token prefill.

``laquant eval speed --suite e2e`` reports the same decode profile for any model. This script
exists for a quick A/B of two trees on a small model, and for the prefill profile.
"""
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from profile_prefill import random_gla

from laquant.adapters import cache_kwargs, returned_cache
from laquant.models import GLAConfig


def kernel_profile(fn, layers: int) -> dict:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name = {}
    for e in events:
        n, t = by_name.get(e.name, (0, 0.0))
        by_name[e.name] = (n + 1, t + e.device_time)
    top = sorted(((k[:60], n, round(t, 1)) for k, (n, t) in by_name.items()), key=lambda r: -r[2])[:12]
    return {"kernels_per_layer": len(events) / layers, "gpu_ms": sum(e.device_time for e in events) / 1e3,
            "top": top}


def graphed_ms(model, step, cache, reps: int = 30) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            model(step, **cache_kwargs(model, cache))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(step, **cache_kwargs(model, cache))
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


@torch.no_grad()
def main(out_path: str, layers: int = 4, hidden: int = 2048) -> None:
    cfg = GLAConfig(hidden_size=hidden, num_hidden_layers=layers, num_heads=16, vocab_size=32000)
    result = {}
    for variant in ("bf16", "gla_int8", "gla_int8_all"):
        model = random_gla(cfg, variant)
        row = {}
        for B in (1, 64):
            out = model(torch.randint(0, 32000, (B, 512), device="cuda"), use_cache=True, logits_to_keep=1)
            cache, step = returned_cache(out), out.logits[:, -1:].argmax(-1)
            for _ in range(3):
                model(step, **cache_kwargs(model, cache))
            if B == 64:
                row["decode"] = kernel_profile(lambda: model(step, **cache_kwargs(model, cache)), layers)
            row[f"graphed_B{B}_ms_per_step"] = graphed_ms(model, step, cache)
        ids = torch.randint(0, 32000, (1, 4096), device="cuda")
        row["prefill"] = kernel_profile(lambda: model(ids, logits_to_keep=1), layers)
        row["prefill_4k_tok_s"] = 4096 / (do_bench(lambda: model(ids, logits_to_keep=1), rep=50,
                                                   return_mode="median") * 1e-3)
        result[variant] = row
        print(variant, json.dumps({k: v for k, v in row.items() if not isinstance(v, dict)}), flush=True)
        del model
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
