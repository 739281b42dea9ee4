"""laquant's own host time in a quantized forward, measured on a CPU (issue #14: the eager paths are host-bound, and
the lent GPUs' hosts are too noisy to time Python changes): a random 2048-wide GLA calibrated with a recipe runs its
CUDA code path on CPU tensors (``Tensor.is_cuda`` patched to True, side streams off) with every Triton launch stubbed
out, so what is timed is the Python of laquant's modules and launch wrappers (plus PyTorch's allocations and views),
not Triton's and not the GPU's. The lm_head is left out (its CPU matmul would dominate).

    python3 tools/host_path_cpu.py                      # per-layer time (two depths' difference, medians of 5
                                                        # alternated rounds), gla_int8_all
    python3 tools/host_path_cpu.py --recipe gla_int8 --tokens 64 --attribute   # and the wrappers' share

``--attribute`` times the projection groups' lookups, the norms, GEMM and gate wrappers (inclusive, per call) by
wrapping them; the wrapping itself adds ~1 us a call.
"""
import argparse
import functools
import importlib
import os
import sys
import time

import torch


def build(layers: int, recipe: str):
    from profile_prefill import random_gla

    from laquant.models import GLAConfig

    model = random_gla(GLAConfig(hidden_size=2048, num_hidden_layers=layers, num_heads=16, vocab_size=32000), recipe,
                       device="cpu")
    model.lm_head = torch.nn.Identity()
    return model


def stub_launches() -> list:
    """Triton launches become no-ops counted in the returned list; the CUDA code path runs on CPU tensors."""
    import triton.runtime.jit as jit

    from laquant.kernels.common import launch

    calls = []
    jit.JITFunction.run = lambda self, *args, grid, warmup, **kwargs: calls.append(self.__name__)
    launch.ENABLED = False  # its fast path asks for a CUDA device
    os.environ["LAQUANT_SIDE_STREAM"] = "0"
    torch.Tensor.is_cuda = property(lambda self: True)
    return calls


def forward_ms(model, tokens: int, reps: int = 30, warmup: int = 3) -> float:
    ids = torch.randint(0, 32000, (1, tokens))
    with torch.no_grad():
        for _ in range(warmup):
            model(ids, use_cache=True)
        t0 = time.perf_counter()
        for _ in range(reps):
            model(ids, use_cache=True)
    return (time.perf_counter() - t0) / reps * 1e3


ATTRIBUTED = [("laquant.quant.fused", n) for n in ("packed_group", "w8a8_inputs", "project", "low_rank_gate")] + [
    ("laquant.kernels.gemm.int8", "int8_gemm"), ("laquant.kernels.rowwise.fused", "_launch_norm"),
    ("laquant.kernels.rowwise.fused", "glu_triton"), ("laquant.kernels.gla.gate", "low_rank_gate_log_decay_triton"),
    ("laquant.kernels.gla.chunk", "chunk_gla_triton"), ("laquant.kernels.common.store", "store_state_triton")]


def attribute(stats: dict) -> None:
    """Wrap :data:`ATTRIBUTED` (and rebind the names other laquant modules imported) to time each call."""
    wrapped = {}
    for modname, name in ATTRIBUTED:
        mod = importlib.import_module(modname)
        fn = getattr(mod, name)

        @functools.wraps(fn)
        def timed(*args, _fn=fn, _key=f"{modname.rsplit('.', 1)[-1]}.{name}", **kwargs):
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                entry = stats.setdefault(_key, [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - t0

        setattr(mod, name, timed)
        wrapped[fn] = timed
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("laquant"):
            for attr, value in list(vars(mod).items()):
                if callable(value) and value in wrapped:
                    setattr(mod, attr, wrapped[value])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="gla_int8_all")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--attribute", action="store_true")
    args = ap.parse_args()
    small, large = build(2, args.recipe), build(6, args.recipe)
    calls = stub_launches()
    rounds = [(forward_ms(small, args.tokens), forward_ms(large, args.tokens)) for _ in range(5)]  # alternated
    a, b = (sorted(r[i] for r in rounds)[2] for i in (0, 1))  # medians: this machine's speed drifts
    calls.clear()
    forward_ms(large, args.tokens, reps=1, warmup=0)
    print(f"{args.recipe}, {args.tokens} tokens: {(b - a) / 4 * 1e3:.0f} us of host time a layer "
          f"({len(calls) / 6:.0f} Triton launches a layer, stubbed)")
    if args.attribute:
        stats: dict = {}
        attribute(stats)
        reps = 30
        forward_ms(large, args.tokens, reps=reps, warmup=0)
        for key, (n, t) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
            print(f"  {key:42s} {n / reps / 6:4.1f} a layer  {t / n * 1e6:6.1f} us a call (inclusive)")


if __name__ == "__main__":
    main()
