"""laquant's own host time in a quantized forward, measured on a CPU (issue #14: the eager paths are host-bound, and
the lent GPUs' hosts are too noisy to time Python changes): a random 2048-wide GLA calibrated with a recipe runs its
CUDA code path on CPU tensors (``Tensor.is_cuda`` patched to True, side streams off) with every Triton launch stubbed
out, so what is timed is the Python of laquant's modules and launch wrappers (plus PyTorch's allocations and views),
not Triton's and not the GPU's. The lm_head is left out (its CPU matmul would dominate).

    python3 tools/host_path_cpu.py                      # per-layer time (two depths' difference, medians of 5
                                                        # alternated rounds), gla_int8_all
    python3 tools/host_path_cpu.py --recipe gla_int8 --tokens 64 --attribute   # and the wrappers' share
    python3 tools/host_path_cpu.py --family qwen3_next   # a hybrid of tools/family_configs.py, hybrid_int8 (per layer:
                                                         # the difference of 1 and 3 periods of its layer pattern)
    python3 tools/host_path_cpu.py --family qwen3_next --decode-step 8 [--moe]
                                                         # the launches of one eager decode step of 8 sequences on a
                                                         # dynamic cache, a layer and outside the layers

``--attribute`` times the projection groups' lookups, the norms, GEMM and gate wrappers (inclusive, per call) by
wrapping them; the wrapping itself adds ~1 us a call.
"""
import argparse
import functools
import importlib
import os
import sys
import time
from collections import Counter

import torch


def period(family: str) -> int:
    """The layers of one repeat of a family's layer pattern in ``family_configs`` (1 for GLA)."""
    if family == "gla":
        return 1
    from family_configs import CONFIGS

    fields = CONFIGS[family]
    types = fields.get("layer_types") or fields.get("layers_block_type")
    if types is None:
        return 4 if family == "qwen3_next" else 1  # qwen3_next: transformers' full_attention_interval
    return next(p for p in range(1, len(types) + 1) if types == (types[:p] * len(types))[:len(types)])


def build(layers: int, recipe: str, family: str = "gla", moe: bool = False):
    """A random 2048-wide model of ``layers`` layers calibrated with ``recipe`` on the CPU, without its lm_head
    (``moe``: the family's MoE config, ``family_configs.MOE_CONFIGS``)."""
    if family == "gla":
        from profile_prefill import random_gla

        from laquant.models import GLAConfig

        model = random_gla(GLAConfig(hidden_size=2048, num_hidden_layers=layers, num_heads=16, vocab_size=32000),
                           recipe, device="cpu")
    else:
        from family_configs import CONFIGS, MOE_CONFIGS

        from laquant.adapters import install
        from laquant.api import calibrate
        from laquant.eval.speed import hybrid_config, hybrid_model
        from laquant.recipe import load_recipe

        fields = dict((MOE_CONFIGS if moe else CONFIGS)[family])
        for key in ("layer_types", "layers_block_type", "mlp_layer_types"):
            if key in fields:
                fields[key] = fields[key][:layers]
        if "layers_block_type" not in fields:
            fields["num_hidden_layers"] = layers
        cfg = hybrid_config(family, fields)
        torch.manual_seed(0)
        model = hybrid_model(family, cfg).to(torch.bfloat16).eval()
        install(model)
        if recipe != "bf16":
            model = calibrate(model, load_recipe(recipe), data=torch.randint(0, cfg.vocab_size, (2, 256)),
                              progress=False).model
    model.lm_head = torch.nn.Identity()
    return model


def stub_launches(on_launch=None) -> list:
    """Triton launches become no-ops counted in the returned list (each kernel's name), or handed to
    ``on_launch(kernel, grid, args, kwargs)``; the CUDA code path runs on CPU tensors."""
    import triton.runtime.jit as jit

    from laquant.kernels.common import launch

    calls = []

    def run(self, *args, grid, warmup, **kwargs):
        if on_launch is None:
            calls.append(self.__name__)
        else:
            on_launch(self, grid, args, kwargs)

    jit.JITFunction.run = run
    launch.ENABLED = False  # its fast path asks for a CUDA device
    os.environ["LAQUANT_SIDE_STREAM"] = "0"
    torch.Tensor.is_cuda = property(lambda self: True)
    torch.cuda.is_current_stream_capturing = lambda: False  # CPU torch cannot answer it
    return calls


def assume_checks_pass(model) -> None:
    """Mark the fused forwards' classes in ``model`` as having passed their first-use check against transformers'
    forward (laquant.models.first_use): stubbed kernels cannot pass it, and on a GPU they pass (or the class is
    warned of and keeps transformers' forward)."""
    from laquant.models import fused_moe
    from laquant.models.quantizing_rowwise import original_class

    checked = [(fused_moe._FusedRouting, fused_moe._CHECKED), (fused_moe._FusedGatedShared, fused_moe._CHECKED)]
    try:
        from laquant.models import fused_rotary

        checked.append((fused_rotary._FusedRotary, fused_rotary._CHECKED))
    except ImportError:  # a checkout from before it (counted against this one)
        pass
    for module in model.modules():
        for fused, checks in checked:
            if isinstance(module, fused):
                checks[original_class(module)] = True


def forward_ms(model, tokens: int, reps: int = 30, warmup: int = 3) -> float:
    ids = torch.randint(0, 32000, (1, tokens))
    with torch.no_grad():
        for _ in range(warmup):
            model(ids, use_cache=True)
        t0 = time.perf_counter()
        for _ in range(reps):
            model(ids, use_cache=True)
    return (time.perf_counter() - t0) / reps * 1e3


def aten_ops(model, tokens: int) -> dict:
    """The PyTorch ops one forward calls from Python (not those they call in turn), by name: each costs the host a
    dispatch, and on a GPU's host an allocating one several microseconds."""
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(0, 32000, (1, tokens))
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(ids, use_cache=True)
    return top_level_ops(prof)


def top_level_ops(prof) -> dict:
    """The ``aten::`` ops of a CPU profile called from Python (not from another aten op), by name."""
    counts: dict = {}
    for event in prof.events():
        parent = event.cpu_parent
        if event.name.startswith("aten::") and (parent is None or not parent.name.startswith("aten::")):
            counts[event.name] = counts.get(event.name, 0) + 1
    return counts


def depths(family: str) -> tuple[int, int]:
    """The two model depths whose difference gives a layer's share: 2 and 6 layers, or 1 and 3 periods of the
    family's layer pattern."""
    unit = period(family)
    return (2, 6) if unit == 1 else (unit, 3 * unit)


def decode_step_launches(model, batch: int, calls: list, prompt: int = 16) -> tuple[dict, dict]:
    """``(Triton launches, PyTorch ops)`` by name of one eager decode step of ``batch`` sequences after a
    ``prompt``-token prefill on a dynamic cache, launches stubbed (:func:`stub_launches`'s ``calls``), the fused
    forwards' first-use checks taken as passed (:func:`assume_checks_pass`)."""
    from torch.profiler import ProfilerActivity, profile

    from laquant.adapters import cache_kwargs, new_cache

    assume_checks_pass(model)
    try:  # the step's own pool slots (kept a step by laquant.models.recurrent), not another model's
        from laquant.models import recurrent

        recurrent._EAGER_SLOTS.clear()
    except AttributeError:  # a checkout from before them (counted against this one)
        pass
    cache = new_cache(model)
    ids = torch.randint(0, 1000, (batch, prompt + 1))
    with torch.no_grad():
        model(input_ids=ids[:, :prompt], **cache_kwargs(model, cache), use_cache=True)
        calls.clear()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(input_ids=ids[:, prompt:], **cache_kwargs(model, cache), use_cache=True)
    return dict(Counter(calls)), top_level_ops(prof)


# PyTorch ops that launch no kernel (views, allocations, metadata); the rest are counted as launches (`to` and
# `contiguous` too, though some copy nothing: upper bounds)
NO_LAUNCH = ("empty", "empty_like", "empty_strided", "view", "reshape", "slice", "select", "unsqueeze", "squeeze",
             "unflatten", "split_with_sizes", "split", "expand", "transpose", "alias", "as_strided", "t", "permute",
             "chunk", "narrow", "detach", "lift_fresh", "_unsafe_view", "unbind")


def report_decode_step(family: str, recipe: str, batch: int, moe: bool) -> None:
    """Print the launches a layer (two depths' difference) and outside the layers of one eager decode step."""
    few, many = depths(family)
    models = build(few, recipe, family, moe), build(many, recipe, family, moe)
    calls = stub_launches()
    (t0, o0), (t1, o1) = (decode_step_launches(m, batch, calls) for m in models)

    def launching(ops):
        return {k: v for k, v in ops.items() if k.removeprefix("aten::") not in NO_LAUNCH}

    o0, o1 = launching(o0), launching(o1)
    for what, a, b in (("Triton", t0, t1), ("PyTorch ops that launch", o0, o1)):
        layer = {k: (b.get(k, 0) - a.get(k, 0)) / (many - few) for k in set(a) | set(b)}
        outside = {k: a.get(k, 0) - few * layer[k] for k in set(a) | set(b)}
        for where, counts in (("a layer", layer), ("outside the layers", outside)):
            items = sorted(((n, k.removeprefix("aten::")) for k, n in counts.items() if n), reverse=True)
            print(f"{what}, {where}: {sum(counts.values()):g} ({', '.join(f'{k} {n:g}' for n, k in items)})")


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
    ap.add_argument("--family", default="gla", help="gla, or a hybrid family of tools/family_configs.py")
    ap.add_argument("--recipe", help="default: gla_int8_all for gla, hybrid_int8 for a hybrid")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--attribute", action="store_true")
    ap.add_argument("--decode-step", type=int, metavar="B",
                    help="count one eager decode step's launches of B sequences")
    ap.add_argument("--moe", action="store_true", help="the family's MoE config (family_configs.MOE_CONFIGS)")
    args = ap.parse_args()
    recipe = args.recipe or ("gla_int8_all" if args.family == "gla" else "hybrid_int8")
    if args.decode_step:
        report_decode_step(args.family, recipe, args.decode_step, args.moe)
        return
    few, many = depths(args.family)
    small, large = build(few, recipe, args.family), build(many, recipe, args.family)
    assume_checks_pass(small)
    assume_checks_pass(large)
    calls = stub_launches()
    rounds = [(forward_ms(small, args.tokens), forward_ms(large, args.tokens)) for _ in range(5)]  # alternated
    a, b = (sorted(r[i] for r in rounds)[2] for i in (0, 1))  # medians: this machine's speed drifts
    calls.clear()
    forward_ms(small, args.tokens, reps=1, warmup=0)
    launches = len(calls)
    calls.clear()
    forward_ms(large, args.tokens, reps=1, warmup=0)
    launches = (len(calls) - launches) / (many - few)
    ops = aten_ops(small, args.tokens), aten_ops(large, args.tokens)
    per_layer = {k: (ops[1].get(k, 0) - ops[0].get(k, 0)) / (many - few) for k in set(ops[0]) | set(ops[1])}
    print(f"{args.family} {recipe}, {args.tokens} tokens: {(b - a) / (many - few) * 1e3:.0f} us of host time a layer "
          f"({launches:.1f} Triton launches a layer, stubbed; "
          f"{sum(per_layer.values()):.1f} PyTorch ops a layer: "
          + ", ".join(f"{k.removeprefix('aten::')} {n:g}" for k, n in sorted(per_layer.items(), key=lambda kv: -kv[1])
                      if n) + ")")
    if args.attribute:
        stats: dict = {}
        attribute(stats)
        reps = 30
        forward_ms(large, args.tokens, reps=reps, warmup=0)
        for key, (n, t) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
            print(f"  {key:42s} {n / reps / many:4.1f} a layer  {t / n * 1e6:6.1f} us a call (inclusive)")


if __name__ == "__main__":
    main()
