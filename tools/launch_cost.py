"""Host cost of one kernel launch, piece by piece (issue #14: the eager prefill and decode are host-bound): for the
norm that writes a GEMM's codes and for the split-K / tiled int8 GEMM, the laquant wrapper's call, Triton's
``kernel[grid](...)`` on the same arguments (``JITFunction.run``: binder, cache key, launcher), its parts (the
binder; the cache key), and the compiled kernel's launcher called directly (the floor a cached launch could reach);
also ``torch.empty`` and an ``os.environ`` read. ``wrapper_us`` launches as the model does (through
``launch_kernel``). Medians of 9 rounds of 200 calls each, enqueue time only (the GPU kernels are short, the queue
never fills).

    python3 tools/launch_cost.py OUT.json
"""
import json
import os
import sys
import time

import torch
import triton.runtime.jit as tjit
from triton.runtime import driver
from triton.runtime.jit import compute_cache_key

from laquant.kernels.common import launch as launch_mod
from laquant.kernels.gemm.configs import choose_config
from laquant.kernels.gemm.int8 import PackedOutlierWeight, int8_gemm
from laquant.kernels.rowwise.fused import rms_norm_triton


def per_call_us(fn, n=200, rounds=9) -> float:
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return sorted(times)[rounds // 2]


def captured_launch(call):
    """The (JITFunction, args, kwargs, grid) of the one Triton launch ``call()`` makes."""
    seen = []
    real = tjit.JITFunction.run

    def spy(self, *args, grid, warmup, **kwargs):
        seen.append((self, args, dict(kwargs), grid))
        return real(self, *args, grid=grid, warmup=warmup, **kwargs)

    tjit.JITFunction.run = spy
    fast, launch_mod.ENABLED = launch_mod.ENABLED, False  # every launch through JITFunction.run while spied on
    try:
        call()
    finally:
        tjit.JITFunction.run = real
        launch_mod.ENABLED = fast
    if len(seen) != 1:
        raise RuntimeError(f"expected one Triton launch, saw {len(seen)}")
    return seen[0]


def pieces(name, call) -> dict:
    fn, args, kwargs, grid = captured_launch(call)
    device = driver.active.get_current_device()
    stream = driver.active.get_current_stream(device)
    _, key_cache, _, _, binder = fn.device_caches[device]
    bound, spec, options = binder(*args, **kwargs)
    compiled = fn.run(*args, grid=grid, warmup=False, **kwargs)
    vals = list(bound.values())
    g = tuple(grid) + (1,) * (3 - len(grid))
    meta = compiled.launch_metadata(grid, stream, *vals)

    def direct():
        compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, meta, None, None, *vals)

    row = dict(wrapper_us=per_call_us(call),
               triton_run_us=per_call_us(lambda: fn.run(*args, grid=grid, warmup=False, **kwargs)),
               binder_us=per_call_us(lambda: binder(*args, **kwargs)),
               cache_key_us=per_call_us(lambda: compute_cache_key(key_cache, spec, options)),
               direct_launch_us=per_call_us(direct), args=len(args), kernel=fn.fn.__name__)
    print(name, {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    return row


def main(out: str) -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = {}
    K, N = 2048, 6144
    q = torch.randint(-127, 128, (N, K), dtype=torch.int8, device=dev)
    outliers = torch.arange(8, device=dev, dtype=torch.long) * 97
    keep = torch.ones(K, dtype=torch.bool, device=dev)
    keep[outliers] = False
    keep_idx = keep.nonzero().flatten()
    KQ = -(-keep_idx.numel() // 16) * 16
    qw = torch.zeros(N, KQ, dtype=torch.int8, device=dev)
    qw[:, :keep_idx.numel()] = q[:, keep_idx]
    packed = PackedOutlierWeight.pack(qw, torch.rand(N, 1, device=dev) * 1e-3, keep_idx, outliers.int(),
                                      torch.randn(N, 8, device=dev).bfloat16(), None, K)
    w = torch.randn(K, device=dev).bfloat16()
    for M in (64, 4096):
        x = torch.randn(M, K, device=dev).bfloat16()
        r = torch.randn(M, K, device=dev).bfloat16()
        rows[f"norm_codes_M{M}"] = pieces(f"norm+codes M={M}", lambda: rms_norm_triton(x, w, 1e-6, r, packed))  # noqa: B023
        _, _, codes = rms_norm_triton(x, w, 1e-6, r, packed)
        y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        cfg = choose_config("w8a8", M, N, K, torch.cuda.get_device_name(dev))
        rows[f"gemm_M{M}"] = pieces(f"gemm M={M}", lambda: int8_gemm(*codes, packed, y, cfg))  # noqa: B023
    rows["torch_empty_us"] = per_call_us(lambda: torch.empty(64, 2048, device=dev, dtype=torch.bfloat16))
    rows["environ_get_us"] = per_call_us(lambda: os.environ.get("LAQUANT_PDL", "1"))
    print({k: v for k, v in rows.items() if k.endswith("_us")}, flush=True)
    with open(out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
