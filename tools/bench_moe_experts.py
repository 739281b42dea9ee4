"""A MoE layer's routed experts: laquant's int8 grouped kernels (kernels/moe/grouped.py) against transformers' bf16
``grouped_mm`` and ``batched_mm`` on the layer shapes of released MoE hybrids, T = 1 ... 4,096 tokens; GPU time of
a CUDA graph of one call (triton.testing.do_bench_cudagraph), the byte floor (each chosen expert's weights read once,
at the device's copy bandwidth measured in the same run), and the int8 output against its reference and against
transformers' bf16 experts.

The alignment's one launch (``align_pairs``) is timed against its PyTorch spec. ``--sweep``: at the decode sizes
(T = 1, 8, 64; every T with ``--sweep-prefill`` too) each shape is also timed at every tile of a small grid (the
rule's block of rows and the next, output tiles of 32-128, two K steps) and at the rule's choice (``_tiles``), and
the fastest is reported beside the rule's.

    python3 tools/bench_moe_experts.py OUT.json [--sweep [--sweep-prefill]]      (GPU)
"""
import itertools
import json
import sys
import types

import torch
import triton
from transformers.integrations import moe

from laquant.kernels.common.sizes import sm_count
from laquant.kernels.moe.grouped import Tiles, _tiles, align_pairs, align_pairs_reference, int8_experts_triton
from laquant.kernels.moe.reference import int8_experts
from laquant.quant.experts import QuantExperts

# name: (experts, hidden, intermediate, top-k), each a layer of the released model
SHAPES = {"qwen3_next_80b_a3b": (512, 2048, 512, 10), "kimi_linear_48b_a3b": (256, 2304, 1024, 8),
          "minimax_family_config": (4, 2048, 1408, 2)}
TOKENS = (1, 8, 64, 256, 4096)
DTYPE = torch.bfloat16  # the tokens' and transformers' experts' dtype


def copy_bandwidth() -> float:
    a = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench_cudagraph(lambda: b.copy_(a))
    return 2 * a.numel() / (ms * 1e-3)


def hf_experts(E, H, I, dtype):
    self = types.SimpleNamespace(
        gate_up_proj=torch.randn(E, 2 * I, H, device="cuda", dtype=dtype) / H ** 0.5,
        down_proj=torch.randn(E, H, I, device="cuda", dtype=dtype) / I ** 0.5, has_gate=True, has_bias=False,
        is_transposed=False, has_post_expert_norm=False, _is_expert_parallel=False, num_experts=E,
        act_fn=torch.nn.SiLU())
    self._apply_gate = lambda h: moe._default_apply_gate(self, h)
    return self


SWEEP = "--sweep" in sys.argv


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def sweep(args, rule, want):
    """Every tile of the grid (and the rule's) at these arguments: [{tiles, ms}], each output checked against
    ``want`` (the rule's)."""
    rows = sorted({rule.block_m, min(2 * rule.block_m, 64)})  # the rule's block and the next
    grid = {Tiles(m, n_in, n_out, bk) for m in rows for n_in, n_out, bk in itertools.product(
        (32, 64, 128), (32, 64, 128), (128, 256) if m <= 32 else (64, 128))}
    out = []
    for tiles in sorted(grid | {rule}):
        assert rel_err(int8_experts_triton(*args, tiles=tiles), want) < 1e-2, tiles
        ms = triton.testing.do_bench_cudagraph(lambda: int8_experts_triton(*args, tiles=tiles))
        out.append(dict(tiles=tiles._asdict(), ms=round(ms, 4)))
    return out


def main():
    bandwidth = copy_bandwidth()
    rows = []
    for name, (E, H, I, k) in SHAPES.items():
        bf16 = hf_experts(E, H, I, DTYPE)
        with torch.no_grad():
            q = QuantExperts.from_experts(bf16)
        for T in TOKENS:
            x = torch.randn(T, H, device="cuda", dtype=DTYPE)
            logits = torch.randn(T, E, device="cuda")
            weights, index = logits.softmax(-1).topk(k, -1)
            used = index.unique().numel()
            args = (x, index, weights.to(DTYPE), q.in_qweight, q.in_scale, q.out_qweight, q.out_scale,
                    "silu", True)
            got = int8_experts_triton(*args)
            err = rel_err(int8_experts(*args), got)  # relative to the kernels' output, as recorded so far
            # int8 weights against the bf16 ones
            err_bf16 = rel_err(got, moe.grouped_mm_experts_forward(bf16, x, index, weights))
            rule = _tiles(T * k, E, I, H, sm_count(x.device))
            times = {"int8_grouped": triton.testing.do_bench_cudagraph(lambda: int8_experts_triton(*args))}
            for impl, align in (("align_one_launch", align_pairs), ("align_torch", align_pairs_reference)):
                times[impl] = triton.testing.do_bench_cudagraph(lambda: align(index, E, rule.block_m))
            for impl in ("grouped_mm", "batched_mm"):
                fn = getattr(moe, f"{impl}_experts_forward")
                try:
                    times[f"bf16_{impl}"] = triton.testing.do_bench_cudagraph(lambda: fn(bf16, x, index, weights))
                except Exception as exc:  # an implementation this torch or shape does not capture
                    times[f"bf16_{impl}"] = None
                    print(f"{name} T={T} {impl}: {type(exc).__name__}: {exc}", flush=True)
            expert_bytes = 3 * H * I
            floor_int8 = used * expert_bytes / bandwidth * 1e3
            row = dict(shape=name, E=E, H=H, I=I, k=k, T=T, experts_used=used,
                       ms={n: (round(t, 4) if t else None) for n, t in times.items()},
                       floor_ms_int8=round(floor_int8, 4), floor_ms_bf16=round(2 * floor_int8, 4),
                       int8_of_floor=round(floor_int8 / times["int8_grouped"], 3), rel_err_vs_reference=err,
                       rel_err_vs_bf16=err_bf16, rule=rule._asdict())
            if SWEEP and (T <= 64 or "--sweep-prefill" in sys.argv):
                row["sweep"] = sweep(args, rule, got)
                best = min(row["sweep"], key=lambda r: r["ms"])
                row["best"], row["rule_over_best"] = best, round(times["int8_grouped"] / best["ms"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   copy_GBps=round(bandwidth / 1e9, 1), rows=rows), open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
