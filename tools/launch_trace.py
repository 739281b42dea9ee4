"""Every Triton launch of a quantized model's CUDA code path, recorded on a CPU: the check that a change to the host
code (launch wrappers, the projection groups, the models' glue) hands every kernel the same arguments as before.

The model runs its CUDA path on CPU tensors as ``tools/host_path_cpu.py`` runs it (``Tensor.is_cuda`` patched, side
streams off, launches stubbed out); each launch is recorded as the kernel's name, its grid, and each argument: a
tensor as its dtype, shape, strides and storage offset and which earlier argument of the same launch it shares
memory with, anything else as its value. Passes: a prefill of ``--tokens`` tokens of 2 sequences with a cache, then
two one-token decode steps, then a prefill of 300 tokens (past the norms' tiled-codes threshold) without a cache.

    python3 tools/launch_trace.py OUT.json                        # GLA 2048 x 2 with gla_int8_all, and more variants
    python3 tools/launch_trace.py OUT.json --compare BEFORE.json  # and exit 1 naming the first launch that differs
"""
import argparse
import json
import os
import sys

import torch

VARIANTS = ("gla:gla_int8_all", "gla:gla_int8", "gla:gla_int8_all+projections.act_granularity=per_group",
            "gla:bf16", "qwen3_next:hybrid_int8", "nemotron_h:hybrid_int8")
# small widths of each family (4 layers), so that calibration on the CPU is quick
HYBRID_FIELDS = {
    "qwen3_next": dict(hidden_size=512, num_hidden_layers=4, intermediate_size=1024, num_attention_heads=8,
                       num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
                       linear_key_head_dim=64, linear_value_head_dim=64, num_experts=0, full_attention_interval=2,
                       vocab_size=1000),
    "nemotron_h": dict(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                       num_key_value_heads=2, head_dim=64, mamba_num_heads=16, mamba_head_dim=64, n_groups=2,
                       ssm_state_size=64, chunk_size=64, use_mamba_kernels=False,
                       layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"]),
}


def build(variant: str):
    family, recipe = variant.split(":", 1)
    if family == "gla":
        sys.path.insert(0, os.path.dirname(__file__))
        from profile_prefill import random_gla

        from laquant.models import GLAConfig

        return random_gla(GLAConfig(hidden_size=2048, num_hidden_layers=2, num_heads=16, vocab_size=32000), recipe,
                          device="cpu")
    from laquant.adapters import install
    from laquant.api import calibrate
    from laquant.eval.speed import hybrid_config, hybrid_model
    from laquant.recipe import load_recipe

    cfg = hybrid_config(family, HYBRID_FIELDS[family])
    torch.manual_seed(0)
    model = hybrid_model(family, cfg).to(torch.bfloat16).eval()
    install(model)
    name, *overrides = recipe.split("+")
    return calibrate(model, load_recipe(name, overrides), data=torch.randint(0, cfg.vocab_size, (2, 128)),
                     progress=False).model


def describe(value, seen: list):
    if isinstance(value, torch.Tensor):
        ptr = value.untyped_storage().data_ptr() if value.numel() else None
        alias = next((i for i, p in enumerate(seen) if p is not None and p == ptr), None)
        seen.append(ptr)
        return ["tensor", str(value.dtype), list(value.shape), list(value.stride()), value.storage_offset(), alias]
    seen.append(None)
    if isinstance(value, float):
        return ["float", float.hex(value)]
    if isinstance(value, (bool, int, str)) or value is None:
        return [type(value).__name__, value]
    return [type(value).__name__, repr(value)]


def record(trace: list):
    """Stub Triton's launches to append their description to ``trace``; the CUDA path on CPU tensors
    (``host_path_cpu.stub_launches``)."""
    from host_path_cpu import stub_launches

    def described(kernel, grid, args, kwargs):
        seen: list = []
        grid = grid(kwargs) if callable(grid) else grid
        trace.append({"kernel": kernel.__name__, "grid": list(grid), "args": [describe(a, seen) for a in args],
                      "kwargs": {k: describe(v, seen) for k, v in sorted(kwargs.items())}})

    stub_launches(described)


@torch.no_grad()
def passes(model, tokens: int, trace: list) -> dict:
    from laquant.generate import prefill

    vocab = model.config.vocab_size
    out = {}
    start = len(trace)
    logits, cache = prefill(model, torch.randint(0, vocab, (2, tokens)))
    out["prefill"] = trace[start:]
    for step in range(2):
        start = len(trace)
        model(torch.randint(0, vocab, (2, 1)), past_key_values=cache, use_cache=True)
        out[f"decode{step}"] = trace[start:]
    start = len(trace)
    model(torch.randint(0, vocab, (1, 300)))
    out["prefill300"] = trace[start:]
    return out


def first_difference(a: dict, b: dict) -> str | None:
    for variant in sorted(set(a) | set(b)):
        if variant not in a or variant not in b:
            return f"{variant}: only in one trace"
        for name in a[variant]:
            la, lb = a[variant][name], b[variant].get(name, [])
            for i, (x, y) in enumerate(zip(la, lb)):
                if x != y:
                    return f"{variant} {name} launch {i} ({x['kernel']}): {json.dumps(x)}\n  against {json.dumps(y)}"
            if len(la) != len(lb):
                return f"{variant} {name}: {len(la)} launches against {len(lb)}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--compare")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    models = {v: build(v) for v in args.variants}
    trace: list = []
    record(trace)
    result = {}
    for variant, model in models.items():
        torch.manual_seed(1)
        result[variant] = passes(model, args.tokens, trace)
        print(variant, {k: len(v) for k, v in result[variant].items()})
    with open(args.out, "w") as f:
        json.dump(result, f)
    if args.compare:
        with open(args.compare) as f:
            diff = first_difference(json.load(f), result)
        print("same launches" if diff is None else f"DIFFERENT: {diff}")
        sys.exit(diff is not None)


if __name__ == "__main__":
    main()
