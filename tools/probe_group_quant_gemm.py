"""What it costs a decode GEMM to quantize its own input, per 128-column group (issue #14,
eval/results/b64_step_budget.md).

Per-token activation scales need a token's whole row before any GEMM program can use a code, so a kernel of its own
(a norm, SwiGLU) writes the codes before every GEMM: 2-3 of the ~9 kernels in a decoder layer's decode step. With one
scale per token and 128-column group, each split-K program could quantize the slice of x it reads itself. This probe
times one split-K kernel skeleton two ways on the same problem, so that only that work differs:

* ``codes``: it reads int8 codes and per-group scales made beforehand (what today's path hands a GEMM);
* ``group_q``: it reads x (bf16) and quantizes each ``[BM, 128]`` tile in its main loop (absmax, scale, codes with
  the exactly rounded quotient of ``triton_numerics.stored_int8_codes``), every column block of programs redoing it.

* ``token_q``: it reads x (bf16) and one scale per token made beforehand (what a producer that only writes its
  rows' absmax could hand over, keeping today's per-token numerics) and makes the codes in its main loop.

``token_q`` is checked against ``codes`` given the per-token codes (the scale repeated for each group). All take the
same codes (the outputs are equal bit for bit, checked) and accumulate ``dot(codes, w) * scale`` per
group in float32; the split-K partials are summed by PyTorch, outside the timing. The 1.37B GLA's decode shapes, M =
1 / 16 / 64, a few tiles each, CUDA-graph medians; the best tile per variant. No fixup, no PDL: a skeleton, for the
difference, not the shipped kernel's absolute time.

    python3 tools/probe_group_quant_gemm.py --out DIR          # DIR/group_quant_gemm.json, .md, .png
    python3 tools/probe_group_quant_gemm.py --out DIR --replot # the markdown and PNG again from DIR's JSON
    TRITON_INTERPRET=1 python3 tools/probe_group_quant_gemm.py --smoke   # the check alone, small shapes, CPU
"""
import argparse
import importlib.util
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

if importlib.util.find_spec("laquant") is None:  # a checkout without laquant installed; an installed one (or
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # one first on PYTHONPATH: a "before") wins

from laquant.kernels.common.triton_numerics import stored_int8_codes  # noqa: E402

GROUP = 128
SHAPES = [(6144, 2048), (2048, 2048), (11264, 2048), (2048, 5632)]  # N x K: q/k/v/g, o, gate/up, down
TOKENS = [1, 16, 64]
# codes made beforehand; codes made in the loop with a scale per 128-group found there; with a scale per token given;
# codes made beforehand with one scale per token, accumulated in int32 and scaled once after the loop (today's GEMM)
VARIANTS = ("codes", "group_q", "token_q", "token_codes")
TILES = [(BN, split) for BN in (32, 64, 128) for split in (1, 2, 4, 8)]


@triton.jit
def _probe_gemm_kernel(x_ptr, xq_ptr, xs_ptr, w_ptr, part_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_Q: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    mm = offs_m < M
    mn = offs_n < N
    groups = K // BK
    per = tl.cdiv(groups, SPLIT_K)
    g_lo = pid_k * per
    g_hi = tl.minimum(groups, g_lo + per)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc_int = tl.zeros([BM, BN], dtype=tl.int32)
    for g in range(g_lo, g_hi):
        kk = g * BK + offs_k
        w = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * K + kk[:, None], mask=mn[None, :], other=0)
        if GROUP_Q == 1:
            x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * K + kk[None, :], mask=mm[:, None], other=0.0)
            x = x.to(tl.float32)
            scale = tl.maximum(tl.max(tl.abs(x), axis=1) / 127.0, 1.1754943508222875e-38)
            a = stored_int8_codes(x, scale[:, None])
        elif GROUP_Q == 2:
            x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * K + kk[None, :], mask=mm[:, None], other=0.0)
            scale = tl.load(xs_ptr + offs_m.to(tl.int64) * groups + g, mask=mm, other=1.0)
            a = stored_int8_codes(x.to(tl.float32), scale[:, None])
        else:
            a = tl.load(xq_ptr + offs_m[:, None].to(tl.int64) * K + kk[None, :], mask=mm[:, None], other=0)
            scale = tl.load(xs_ptr + offs_m.to(tl.int64) * groups + g, mask=mm, other=0.0)
        if GROUP_Q == 3:
            acc_int += tl.dot(a, w, out_dtype=tl.int32)
        else:
            acc += tl.dot(a, w, out_dtype=tl.int32).to(tl.float32) * scale[:, None]
    if GROUP_Q == 3:
        acc = acc_int.to(tl.float32) * tl.load(xs_ptr + offs_m.to(tl.int64) * groups, mask=mm, other=0.0)[:, None]
    tl.store(part_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :], acc, mask=mm[:, None] & mn[None, :])


def group_codes(x: torch.Tensor, per_token: bool = False):
    """Per-token, per-128-column codes and scales of x, as PyTorch rounds them (the reference's); ``per_token``: one
    scale a token, repeated for each group."""
    M, K = x.shape
    xg = x.float().view(M, K // GROUP, GROUP)
    scale = (xg.abs().amax(-1) / 127.0).clamp_min(1.1754943508222875e-38)
    if per_token:
        scale = scale.amax(-1, keepdim=True).expand(M, K // GROUP)
    codes = torch.round(xg / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return codes.view(M, K), scale.contiguous()


def reference(codes, scale, w, ws):
    """The GEMM of the given codes in float64 (the device's codes: its division may round a tie another way than the
    CPU's, which is the quantizer's business, not the GEMM's)."""
    codes, scale, w, ws = codes.cpu(), scale.cpu(), w.cpu(), ws.cpu()
    M, K = codes.shape
    prods = torch.einsum("mgk,ngk->mng", codes.view(M, -1, GROUP).double(), w.view(w.shape[0], -1, GROUP).double())
    return ((prods * scale.double()[:, None, :]).sum(-1) * ws.double()[None, :]).float()


def run(variant: str, x, xq, xs, w, ws, BN: int, split: int, part=None):
    M, K = x.shape
    N = w.shape[0]
    BM = 16 if M <= 16 else 64
    part = torch.empty(split, M, N, dtype=torch.float32, device=x.device) if part is None else part
    _probe_gemm_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN), split)](
        x, xq, xs, w, part, M, N, K, BM=BM, BN=BN, BK=GROUP, SPLIT_K=split, GROUP_Q=VARIANTS.index(variant),
        num_warps=4, num_stages=3)
    return part


def output(part, ws):
    return part.sum(0) * ws[None, :]


def inputs(M, N, K, device, seed=0, per_token=False):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(M, K, generator=gen) * torch.rand(1, K, generator=gen) * 4).to(device, torch.bfloat16)
    w = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8).to(device)
    ws = (torch.rand(N, generator=gen) / 127).to(device)
    xq, xs = group_codes(x, per_token)
    return x, xq, xs, w, ws


def check(M, N, K, device, BN=32, split=2) -> float:
    """Each in-loop variant's output equals the precomputed codes' bit for bit; the largest difference from the
    float64 reference, relative."""
    worst = 0.0
    for variant, per_token in (("group_q", False), ("token_q", True)):
        x, xq, xs, w, ws = inputs(M, N, K, device, per_token=per_token)
        a = output(run("codes", x, xq, xs, w, ws, BN, split), ws)
        b = output(run(variant, x, xq, xs, w, ws, BN, split), ws)
        if not torch.equal(a, b):
            raise AssertionError(f"{M}x{N}x{K} {variant}: the in-loop codes differ from the precomputed ones "
                                 f"(max |diff| {(a - b).abs().max().item():.3g})")
        ref = reference(xq, xs, w, ws)
        worst = max(worst, ((a.cpu() - ref).abs().max() / ref.abs().max()).item())
    # token_codes sums the int32 products first: another float rounding than codes', checked against the reference
    x, xq, xs, w, ws = inputs(M, N, K, device, per_token=True)
    ref = reference(xq, xs, w, ws)
    y = output(run("token_codes", x, xq, xs, w, ws, BN, split), ws).cpu()
    err = ((y - ref).abs().max() / ref.abs().max()).item()
    if not err < 1e-5:
        raise AssertionError(f"{M}x{N}x{K} token_codes: {err:.3g} off the float64 reference")
    return max(worst, err)


def timed(fn, reps=50):
    graph = torch.cuda.CUDAGraph()
    fn()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / 10)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--smoke", action="store_true", help="check the variants on small shapes (CPU, interpreter)")
    ap.add_argument("--replot", action="store_true", help="only write the markdown and PNG again from DIR's JSON")
    args = ap.parse_args()
    if not (args.smoke or args.out):
        ap.error("give --out DIR for the timings, or --smoke for the check alone")
    if args.replot:
        report(json.loads((Path(args.out) / "group_quant_gemm.json").read_text()), Path(args.out))
        return
    if args.smoke:
        for M, N, K in ((1, 48, 256), (5, 64, 384), (20, 40, 512)):
            print(f"{M}x{N}x{K}: equal, {check(M, N, K, 'cpu'):.2e} off the float64 reference")
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for (N, K), M in itertools.product(SHAPES, TOKENS):
        err = check(M, N, K, "cuda", BN=64, split=4)
        row = dict(N=N, K=K, M=M, rel_err=err, weight_mb=N * K / 1e6)
        for variant in VARIANTS:
            x, xq, xs, w, ws = inputs(M, N, K, "cuda", per_token=variant.startswith("token"))
            best = None
            for BN, split in TILES:
                part = torch.empty(split, M, N, dtype=torch.float32, device="cuda")
                t = timed(lambda: run(variant, x, xq, xs, w, ws, BN, split, part))
                if best is None or t < best[0]:
                    best = (t, BN, split)
            row[variant] = dict(us=round(best[0], 2), BN=best[1], split=best[2])
        for variant in VARIANTS[1:]:
            row[f"{variant}_over_codes"] = round(row[variant]["us"] / row["codes"]["us"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, rows=rows)
    (out / "group_quant_gemm.json").write_text(json.dumps(result, indent=2) + "\n")
    report(result, out)


def report(result: dict, out: Path) -> None:
    """``group_quant_gemm.md`` and ``.png`` (us a call by variant, per shape and M) from the run's JSON."""
    rows = result["rows"]
    variants = [v for v in VARIANTS if v in rows[0]]  # a run from before a variant was added has none of it
    lines = [f"{result['device']}, torch {result['torch']}, Triton {result['triton']}", "",
             "| N x K | M | " + " | ".join(f"{v} us (BN, split)" for v in variants)
             + " | " + " | ".join(f"{v} / codes" for v in variants[1:]) + " |",
             "|---|---|" + "---|" * (2 * len(variants) - 1)]
    lines += [f"| {r['N']} x {r['K']} | {r['M']} | "
              + " | ".join(f"{r[v]['us']} ({r[v]['BN']}, {r[v]['split']})" for v in variants) + " | "
              + " | ".join(str(r[f"{v}_over_codes"]) for v in variants[1:]) + " |" for r in rows]
    (out / "group_quant_gemm.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = sorted({r["M"] for r in rows})
    shapes = list(dict.fromkeys((r["N"], r["K"]) for r in rows))
    by = {(r["N"], r["K"], r["M"]): r for r in rows}
    fig, axes = plt.subplots(1, len(tokens), figsize=(4 * len(tokens), 3.6), sharey=True)
    width = 0.8 / len(variants)
    for ax, M in zip(axes, tokens):
        for i, variant in enumerate(variants):
            us = [by[(N, K, M)][variant]["us"] if (N, K, M) in by else 0 for N, K in shapes]
            ax.bar([x + (i - (len(variants) - 1) / 2) * width for x in range(len(shapes))], us, width, label=variant)
        ax.set_xticks(range(len(shapes)), [f"{N}x{K}" for N, K in shapes], rotation=20, fontsize=8)
        ax.set_title(f"M = {M}")
    axes[0].set_ylabel("us a call (best tile)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"split-K int8 GEMM: codes made before vs in its loop ({result['device']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "group_quant_gemm.png", dpi=120)
    plt.close(fig)

if __name__ == "__main__":
    main()
