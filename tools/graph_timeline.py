"""Where a graphed decode step's wall clock goes, kernel by kernel (issue #14): a random GLA (bf16 and the
given recipes) or a random transformers hybrid (bf16 and a hybrid recipe, as ``laquant eval speed`` builds them)
decodes through laquant.generate's captured step; 10 replays run under torch.profiler, and each instant of them is
split among the kernels running then (two at a time where the gate's side stream overlaps the q/k/v/g GEMM), the
rest counted idle.

    python3 tools/graph_timeline.py OUT.json [LAYERS] [VARIANTS]      # VARIANTS: bf16,gla_int8_all (default)
    python3 tools/graph_timeline.py OUT.json --model 'zamba2:{...}' [--hybrid-recipe hybrid_int8] [--prompt 1024]
"""
import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from profile_prefill import random_gla

from laquant.generate import DecodeSession
from laquant.models import GLAConfig

KERNELS = ("_splitk_gemm_kernel", "_rms_norm_group_kernel", "_rms_norm_kernel", "_gla_decode_kernel", "_swiglu_kernel",
           "_glu_group_kernel", "_low_rank_gate_kernel")


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


def gla_variants(layers: int, variants: str):
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=layers, num_heads=16, vocab_size=32000)
    return [(variant, lambda variant=variant: random_gla(cfg, variant)) for variant in variants.split(",")]


def hybrid_variants(model_id: str, hybrid_recipe: str):
    from laquant.eval.speed import recipe_variants

    return [(variant, make) for _, variant, make in recipe_variants([model_id], "gla_int8", hybrid_recipe)]


@torch.no_grad()
def main(out: str, variants, batch: int = 64, prompt: int = 512) -> None:
    result = {}
    for variant, make in variants:
        model = make()
        ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
        session = DecodeSession(model, ids, 64, graphed=True)
        row = timeline(session)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            session.step()
        torch.cuda.synchronize()
        row["replay_us_per_step_noprof"] = (time.perf_counter() - t0) / 20 * 1e6
        result[f"{variant}_B{batch}"] = row
        print(variant, json.dumps(row)[:3000], flush=True)
        del model, session
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("layers", nargs="?", type=int, default=24, help="the random GLA's layers")
    p.add_argument("variants", nargs="?", default="bf16,gla_int8_all", help="the random GLA's variants")
    p.add_argument("--model", help="a hybrid instead, as eval speed's --model FAMILY:{json} (bf16 and --hybrid-recipe)")
    p.add_argument("--hybrid-recipe", default="hybrid_int8")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt", type=int, default=512)
    args = p.parse_args()
    variants = (hybrid_variants(args.model, args.hybrid_recipe) if args.model
                else gla_variants(args.layers, args.variants))
    main(args.out, variants, args.batch, args.prompt)
