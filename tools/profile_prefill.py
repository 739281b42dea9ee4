"""Where a short prefill's time goes (issue #19's follow-up TTFT, issue #14's prefill): for a random
GLA, bf16 and quantized, the wall time of a T-token prefill against the GPU time of its kernels
(host-bound when the wall is much longer), the kernel count, the top kernels, and the host ops that
wait for the GPU (``aten::item``, synchronisations) with their counts.

    python tools/profile_prefill.py OUT.json [T ...]          # VARIANTS="gla_int8" for the quantized one only
    NUM_HEADS=16 python tools/profile_prefill.py ...           # the heads of the 2048 x 24 GLA (default 4)
    CPROFILE=1 python tools/profile_prefill.py ...             # adds each call's top Python functions (cProfile)
"""
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from laquant.api import calibrate
from laquant.models import GLAConfig, GLAForCausalLM
from laquant.recipe import load_recipe

SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
            "cudaMemcpyAsync", "aten::nonzero", "aten::unique")


def wall_ms(fn, reps: int = 10) -> float:
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def random_gla(cfg: GLAConfig, variant: str, device: str = "cuda") -> GLAForCausalLM:
    """A random GLA of ``cfg`` on ``device`` in bf16 (seed 0), calibrated with ``variant`` on random tokens unless
    bf16; ``variant``: a recipe, ``+``-joined ``SECTION.FIELD=VALUE`` overrides after it as ``--set`` takes them
    (``gla_int8_all+projections.act_granularity=per_group``)."""
    torch.manual_seed(0)
    model = GLAForCausalLM(cfg).to(device, torch.bfloat16).eval()
    if variant != "bf16":
        name, *overrides = variant.split("+")
        model = calibrate(model, load_recipe(name, overrides),
                          data=torch.randint(0, cfg.vocab_size, (4, 512), device=device), progress=False).model
    return model


def prof(fn) -> dict:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    events = p.events()
    cuda = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    by_kernel, by_cpu = {}, {}
    for e in cuda:
        n, t = by_kernel.get(e.name, (0, 0.0))
        by_kernel[e.name] = (n + 1, t + e.device_time)
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU:
            n, t = by_cpu.get(e.name, (0, 0.0))
            by_cpu[e.name] = (n + 1, t + e.self_cpu_time_total)
    top = lambda d: sorted(((k[:70], n, round(t / 1e3, 3)) for k, (n, t) in d.items()), key=lambda r: -r[2])[:15]  # noqa
    return {"kernels": len(cuda), "gpu_ms": sum(e.device_time for e in cuda) / 1e3, "top_kernels": top(by_kernel),
            "top_cpu_self_ms": top(by_cpu), "syncs": {k: by_cpu[k][0] for k in SYNC_OPS if k in by_cpu}}


def host_profile(fn, reps: int = 5) -> list:
    """The Python functions where a call's host time goes (cProfile, cumulative over ``reps`` calls):
    what makes a prefill host-bound when the profiler's ops do not add up to its wall time."""
    p = cProfile.Profile()
    p.enable()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    p.disable()
    out = io.StringIO()
    pstats.Stats(p, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue().splitlines()


@torch.no_grad()
def main(out_path: str, lengths=(64, 256, 4096)) -> None:
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=24, num_heads=int(os.environ.get("NUM_HEADS", 4)),
                    vocab_size=32000)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for variant in os.environ.get("VARIANTS", "bf16 gla_int8").split():
        model = random_gla(cfg, variant)
        rows = {}
        for T in lengths:
            ids = torch.randint(0, 32000, (1, T), device="cuda")
            fn = lambda: model(ids, use_cache=True, logits_to_keep=1)  # noqa: E731
            for _ in range(3):
                fn()
            rows[T] = {"wall_ms": wall_ms(fn), **prof(fn)}
            if os.environ.get("CPROFILE"):
                rows[T]["host_tottime"] = host_profile(fn)
            r = rows[T]
            print(variant, T, "wall", round(r["wall_ms"], 2), "gpu", round(r["gpu_ms"], 2), "kernels", r["kernels"],
                  "syncs", r["syncs"], flush=True)
        result[variant] = rows
        del model
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *[tuple(int(a) for a in sys.argv[2:])] if len(sys.argv) > 2 else ())
