"""Where a graphed B = 64 decode step's wall clock goes, kernel by kernel (issue #14): a random GLA (bf16 and the
given recipes) decodes through laquant.generate's captured step; 10 replays run under torch.profiler, and each
instant of them is split among the kernels running then (two at a time where the gate's side stream overlaps the
q/k/v/g GEMM), the rest counted idle.

    python3 tools/graph_timeline.py OUT.json [LAYERS] [VARIANTS]      # VARIANTS: bf16,gla_int8_all (default)
"""
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from profile_prefill import random_gla

from laquant.generate import DecodeSession
from laquant.models import GLAConfig

KERNELS = ("_splitk_gemm_kernel", "_rms_norm_kernel", "_gla_decode_kernel", "_swiglu_kernel", "_low_rank_gate_kernel")


def short(name: str) -> str:
    return next((k for k in KERNELS if k in name), name[:50])


def timeline(session: DecodeSession, reps: int = 10) -> dict:
    for _ in range(3):
        session.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            session.step()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end, short(e.name)) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0)
    edges = sorted([(a, 1, n) for a, _, n in spans] + [(b, -1, n) for _, b, n in spans])
    share, idle, running, last = {}, 0.0, {}, edges[0][0]
    for t, step, name in edges:  # each instant split evenly among the kernels running then
        if t > last:
            if running:
                count = sum(running.values())
                for k, c in running.items():
                    share[k] = share.get(k, 0.0) + (t - last) * c / count
            else:
                idle += t - last
        last = t
        running[name] = running.get(name, 0) + step
        if not running[name]:
            del running[name]
    dur, calls = {}, {}
    for a, b, n in spans:
        dur[n] = dur.get(n, 0.0) + b - a
        calls[n] = calls.get(n, 0) + 1
    rows = sorted(dur, key=lambda n: -share.get(n, 0.0))
    return {"wall_us_per_step": (spans[-1][1] - spans[0][0]) / reps, "idle_us_per_step": idle / reps,
            "kernels_per_step": len(spans) / reps,
            "rows": [dict(kernel=n, calls=calls[n] / reps, dur_us=round(dur[n] / reps, 1),
                          timeline_us=round(share.get(n, 0.0) / reps, 1)) for n in rows]}


@torch.no_grad()
def main(out: str, layers: int = 24, variants: str = "bf16,gla_int8_all") -> None:
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=layers, num_heads=16, vocab_size=32000)
    result = {}
    for variant in variants.split(","):
        model = random_gla(cfg, variant)
        session = DecodeSession(model, torch.randint(0, 32000, (64, 512), device="cuda"), 64, graphed=True)
        row = timeline(session)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            session.step()
        torch.cuda.synchronize()
        row["replay_us_per_step_noprof"] = (time.perf_counter() - t0) / 20 * 1e6
        result[f"{variant}_B64"] = row
        print(variant, json.dumps(row)[:3000], flush=True)
        del model, session
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) if i == 0 else a for i, a in enumerate(sys.argv[2:])))
