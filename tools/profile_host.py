"""Where the host time of an eager forward goes (issue #14: transformers' ``generate`` and a short prefill run
eagerly, so their speed is the host's): for a random GLA, bf16 and quantized, the wall time of one eager decode
step (B = 1 and 64, after a 512-token prompt) and of a 1,024-token prefill, the GPU time of their kernels, and
cProfile's statistics over repeated calls, dumped as pstats files (``pstats.Stats(path)`` reads them) with the top
functions by own and by cumulative time in the JSON.

    python tools/profile_host.py OUT_DIR          # VARIANTS="bf16 gla_int8_all" by default
    CPROFILE=0 PREFILLS="1024 4096" python tools/profile_host.py OUT_DIR   # wall and GPU time only (for A/B runs of
                                                  # two checkouts, alternated), prefills of 1,024 and 4,096 tokens
"""
import cProfile
import io
import json
import os
import pstats
import sys

import torch
from profile_prefill import random_gla, wall_ms
from torch.profiler import ProfilerActivity, profile

from laquant.eval.speed import cuda_kernels
from laquant.generate import DecodeSession
from laquant.models import GLAConfig


def gpu_ms(fn) -> tuple[float, int]:
    """The summed GPU time (ms) of one call's CUDA kernels, and their count."""
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    kernels = cuda_kernels(p)
    return sum(dur for _, _, dur in kernels) / 1e3, len(kernels)


def host_stats(fn, path: str, reps: int = 10) -> dict:
    p = cProfile.Profile()
    p.enable()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    p.disable()
    p.dump_stats(path)
    out = {}
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(p, stream=s).sort_stats(key).print_stats(40)
        out[key] = s.getvalue().splitlines()
    return out


@torch.no_grad()
def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=24, num_heads=16, vocab_size=32000)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "fast_launch": os.environ.get("LAQUANT_FAST_LAUNCH", "1")}
    cprofile = os.environ.get("CPROFILE", "1") != "0"
    prefills = [int(t) for t in os.environ.get("PREFILLS", "1024").split()]
    for variant in os.environ.get("VARIANTS", "bf16 gla_int8_all").split():
        model = random_gla(cfg, variant)
        rows = {}
        for B in (1, 64):
            prompt = torch.randint(0, 32000, (B, 512), device="cuda")
            session = DecodeSession(model, prompt, 200, graphed=False)
            for _ in range(3):
                session.step()
            step = session.step
            r = {"wall_ms": wall_ms(step, reps=20)}
            r["gpu_ms"], r["kernels"] = gpu_ms(step)
            if cprofile:
                r["host"] = host_stats(step, f"{out_dir}/{variant}_decode_B{B}.pstats")
            rows[f"decode_B{B}"] = r
            print(variant, "decode B", B, "wall", round(r["wall_ms"], 2), "gpu", round(r["gpu_ms"], 2),
                  "kernels", r["kernels"], flush=True)
        for T in prefills:
            ids = torch.randint(0, 32000, (1, T), device="cuda")
            fn = lambda: model(ids, use_cache=True, logits_to_keep=1)  # noqa: E731, B023
            for _ in range(3):
                fn()
            r = {"wall_ms": wall_ms(fn, reps=20)}
            r["gpu_ms"], r["kernels"] = gpu_ms(fn)
            if cprofile:
                r["host"] = host_stats(fn, f"{out_dir}/{variant}_prefill_{T}.pstats")
            rows[f"prefill_{T}"] = r
            print(variant, "prefill", T, "wall", round(r["wall_ms"], 2), "gpu", round(r["gpu_ms"], 2), "kernels",
                  r["kernels"], flush=True)
        result[variant] = rows
        del model
        torch.cuda.empty_cache()
    with open(f"{out_dir}/host_profile.json", "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
