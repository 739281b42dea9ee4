"""Host time of a 4K eager prefill, GLA 2048x24 (16 heads), bf16 vs gla_int8_all: the Python call's time with the GPU
kept busy by a sleep kernel (no launch waits for a kernel, up to the launch queue's ~1,000 entries: past them the
module that fills it is charged the wait), its split by module class (forward hooks: a hooked module leaves laquant's
fused paths, which honour hooks, so that split times a slower path than the wall clock's), the host ops that wait for
the GPU, cProfile's view, and the host cost of one empty Triton launch and of one torch.empty.

    python3 tools/prefill_host_diag.py OUT.json
    FAMILY=nemotron_h PROMPT=1024 python3 tools/prefill_host_diag.py OUT.json   # a hybrid of tools/family_configs.py
"""
import cProfile
import collections
import io
import json
import os
import pstats
import sys
import time

import torch
import triton
import triton.language as tl

from profile_prefill import SYNC_OPS, wall_ms

from laquant.eval.speed import recipe_variants


@triton.jit
def _noop(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, BLOCK: tl.constexpr):
    pass


CFG = '{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'


def host_ms(fn, reps=10):
    """The host time of fn() while the GPU is busy with a long sleep (launches never wait)."""
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000 // 10)  # ~100 ms at ~2 GHz
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return sorted(out)[len(out) // 2] * 1e3


def by_module(model, fn):
    """Exclusive host ms per module class over one call (GPU busy)."""
    total = collections.Counter()
    calls = collections.Counter()
    stack = []

    def pre(m, *a, **k):
        stack.append([type(m).__name__, time.perf_counter(), 0.0])

    def post(m, *a, **k):
        name, t0, child = stack.pop()
        dt = time.perf_counter() - t0
        total[name] += dt - child
        calls[name] += 1
        if stack:
            stack[-1][2] += dt

    hs = []
    for m in model.modules():
        hs.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        hs.append(m.register_forward_hook(post, with_kwargs=True))
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)
    fn()
    torch.cuda.synchronize()
    total.clear(), calls.clear()
    torch.cuda._sleep(400_000_000)
    fn()
    torch.cuda.synchronize()
    for h in hs:
        h.remove()
    return [(k, calls[k], round(v * 1e3, 2)) for k, v in total.most_common(20)]


def sync_counts(fn) -> dict:
    """The host ops of one call that wait for the GPU (or may), by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
        torch.cuda.synchronize()
    counts = collections.Counter(e.name for e in p.events() if e.name in SYNC_OPS)
    return dict(counts)


@torch.no_grad()
def main(out):
    family = os.environ.get("FAMILY")
    prompt = int(os.environ.get("PROMPT", 4096))
    if family:
        from family_configs import CONFIGS

        model_id = f"{family}:{json.dumps(CONFIGS[family])}"
    else:
        model_id = f"config:{CFG}"
    result = {"model": model_id, "prompt": prompt}
    for _, variant, make in recipe_variants([model_id], "gla_int8_all"):
        model = make()
        ids = torch.randint(0, model.config.vocab_size, (1, prompt), device="cuda")
        fn = lambda model=model: model(ids, logits_to_keep=1)  # noqa: E731
        for _ in range(3):
            fn()
        r = {"wall_ms": wall_ms(fn), "host_ms": host_ms(fn), "syncs": sync_counts(fn),
             "by_module": by_module(model, fn)}
        p = cProfile.Profile()
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000_000)
        p.enable()
        fn()
        p.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(p, stream=s).sort_stats("cumulative").print_stats(45)
        r["cprofile_cum"] = s.getvalue().splitlines()
        s = io.StringIO()
        pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(40)
        r["cprofile_tot"] = s.getvalue().splitlines()
        print(variant, r["wall_ms"], r["host_ms"], r["syncs"], r["by_module"], flush=True)
        result[variant] = r
        del model, fn
    # launch floor: an empty Triton kernel with 16 args
    x = torch.empty(16, device="cuda")
    args = [x] * 8 + [7] * 8
    _noop[(1,)](*args, BLOCK=16)
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)
    t0 = time.perf_counter()
    for _ in range(200):
        _noop[(1,)](*args, BLOCK=16)
    result["triton_noop_launch_us"] = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)
    t0 = time.perf_counter()
    for _ in range(200):
        torch.empty(4096, 2048, device="cuda", dtype=torch.bfloat16)
    result["torch_empty_us"] = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    print("noop launch us", result["triton_noop_launch_us"], "empty us", result["torch_empty_us"])
    json.dump(result, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
