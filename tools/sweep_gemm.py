"""Tile sweep for the int8 GEMMs at decode sizes, and the committed dispatch table.

For each layer shape (N x K; the model's fused q/k/v/g and gate/up shapes included) and M bucket:
cuBLAS bf16 (F.linear), the W8A8 path with the old tiled config (``tiled_config``), the W8A8 split-K
kernel over a grid of tiles (with and without ``SWAP_AB``), timed as the model runs it: the GEMM
alone on codes made beforehand (the producer's epilogue writes them), plus the quantize_rows pass
timed once for a module called on its own ("auto"), and the W8A16 weight-only kernel over a grid of
tiles at M <= 16 (above, it lost everywhere in the first sweep: the table keeps its default tiles). CUDA-graph timings (``do_bench_cudagraph``, median);
every call takes the next of several weight copies (> 2 x L2 in all), so the weights stream from
device memory as in a model's decode step, not from L2. Every candidate's output is checked against
a float32 reference before it is timed (a wrong or NaN one is dropped).

    python tools/sweep_gemm.py --out DIR            # sweep, writes DIR/gemm_decode_<device>.{json,md}
                                                    # and DIR/configs_table.py (this GPU's table)
    python tools/sweep_gemm.py --warm I/N           # compile share I of N of the candidates (parallel warm-up)
    python tools/sweep_gemm.py --apply DIR/configs_table.py   # put that GPU's entries into kernels/gemm/configs.py
                                                              # (its other entries and the other GPUs' tables stay)
    python tools/sweep_gemm.py --shapes 7b --out DIR        # another set of shapes (SHAPE_SETS), or "NxK,NxK"
    python tools/sweep_gemm.py --unsync --buckets 64,128,256 --shapes gla --out DIR

``--unsync`` adds the tiles that sidestep Triton's synchronous int8 wgmma: Triton makes a Hopper wgmma
asynchronous only with a float32 accumulator ("the accumulator is not fp32"), so every K step of the int8 dot
with 4 or 8 warps waits for its own wgmma before the next is issued. Two warps take the ``mma.sync`` path
instead (no wgmma, no wait: the warps' loads and products interleave), and a 512-wide K step halves the waits.
Each (shape, bucket) also times the committed table's config in the same run (``w8a8_committed_us``).
"""
import argparse
import itertools
import json
import math
import os
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench, do_bench_cudagraph

from laquant.kernels.gemm.configs import M_BUCKETS, choose_config, tiled_config
from laquant.kernels.gemm.int8 import (PackedOutlierWeight, int8_gemm, int8_outlier_linear_triton,
                                       int8_weight_only_linear_triton, quantize_rows)

# (N, K): the 2048-wide GLA's v/g/o, mlp up, mlp down, fused q/k/v/g and gate/up; then the 1.14B qwen3_next's
# fused q/k/v/z, fused softmax q (with its gate)/k/v, and out_proj / o_proj
SHAPES = [(2048, 2048), (5632, 2048), (2048, 5632), (6144, 2048), (11264, 2048), (12288, 2048), (4608, 2048),
          (2048, 4096)]
# --shapes 7b: a 4096-wide GLA of 32 layers (6.9B, Llama-7B's widths): fused q/k/v/g, o, fused gate/up, down
SHAPES_7B = [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008)]
# --shapes gla: the 1.37B GLA's fused q/k/v/g, o, fused gate/up and down (issue #14's e2e model)
SHAPES_GLA = [(6144, 2048), (2048, 2048), (11264, 2048), (2048, 5632)]
SHAPE_SETS = {"default": SHAPES, "7b": SHAPES_7B, "gla": SHAPES_GLA}
W8A16_MAX_M = 16
N_OUT = 8
STREAM_BYTES = 160 << 20  # weight copies per shape: > 2 x the H100's / H200's L2


@triton.jit
def _empty_kernel(y_ptr):
    tl.store(y_ptr, 1.0)


# --wide: also other warp counts and pipeline depths, and 16-column tiles (the first sweeps fixed 4 warps, 4 stages)
WARPS_STAGES = ((4, 4),)
WIDE_WARPS_STAGES = ((4, 3), (4, 4), (4, 6), (8, 3), (8, 4))
# --unsync: (BK, warps, stages) of the tiles past the synchronous int8 wgmma (see the docstring)
UNSYNC_TILES = ((128, 2, 4), (256, 2, 3), (256, 2, 4), (256, 2, 6), (512, 4, 2), (512, 4, 3), (512, 2, 3))


def candidates(path, M, N, K, wide=False, unsync=False):
    BM = min(64, max(16, triton.next_power_of_2(M)))
    n_m = triton.cdiv(M, BM)
    out = []
    if unsync:
        space = [(swap, BN, BK, (warps, stages)) for swap, BN, (BK, warps, stages)
                 in itertools.product((False, True), (16, 32, 64), UNSYNC_TILES)]
    else:
        space = itertools.product((False, True), (16, 32, 64, 128) if wide else (32, 64, 128), (128, 256),
                                  WIDE_WARPS_STAGES if wide else WARPS_STAGES)
    for swap, BN, BK, (warps, stages) in space:
        if swap and (path != "w8a8" or BN < 64):  # swapped, the weight rows are the MMA's tall side
            continue
        tiles = n_m * triton.cdiv(N, BN)
        for split in (1, 2, 4, 8, 16):
            if split > 1 and (K // split < 2 * BK or tiles * split > 1100):
                continue
            if split == 1 and tiles < 16:
                continue
            c = dict(BM=BM, BN=BN, BK=BK, SPLIT_K=split, FIXUP=True, num_warps=warps, num_stages=stages)
            out.append(dict(c, SWAP_AB=True) if swap else c)
    if path == "w8a8" and M >= 64 and not unsync:
        out.append(tiled_config(M))
    return out


def make_weights(N, K, copies, dev):
    gen = torch.Generator(device=dev).manual_seed(N * 7 + K)
    outliers = torch.randperm(K, device=dev, generator=gen)[:N_OUT].sort().values
    keep = torch.ones(K, dtype=torch.bool, device=dev)
    keep[outliers] = False
    keep_idx = keep.nonzero().flatten()
    KQ = -(-keep_idx.numel() // 16) * 16
    packs = []
    for _ in range(copies):
        q = torch.zeros(N, KQ, dtype=torch.int8, device=dev)
        q[:, :keep_idx.numel()] = torch.randint(-127, 128, (N, keep_idx.numel()), device=dev, generator=gen,
                                                dtype=torch.int8)
        scale = torch.rand(N, 1, device=dev, generator=gen) * 1e-3 + 1e-4
        ow = (torch.randn(N, N_OUT, device=dev, generator=gen) * 0.05).bfloat16()
        packs.append(PackedOutlierWeight.pack(q, scale, keep_idx, outliers, ow, None, K))
    return packs, keep_idx


def reference(x, p, keep_idx):
    w = torch.zeros(p.qweight.shape[0], p.in_features, device=x.device)
    w[:, keep_idx] = p.qweight[:, :keep_idx.numel()].float() * p.scale[:, None]
    w[:, p.outlier_idx.long()] = p.outlier_weight.float()
    return x.float() @ w.T


def rel(a, b):
    a = a.float()
    return float("inf") if not torch.isfinite(a).all() else ((a - b).norm() / b.norm()).item()


def rotating(fn, objs):
    state = [0]

    def call():
        o = objs[state[0] % len(objs)]
        state[0] += 1
        return fn(o)
    return call


def bench(fn):
    return do_bench_cudagraph(fn, rep=5, return_mode="median") * 1e3  # us


def parse_shapes(spec: str) -> list[tuple[int, int]]:
    if spec in SHAPE_SETS:
        return SHAPE_SETS[spec]
    try:
        return [tuple(int(v) for v in item.split("x")) for item in spec.split(",")]
    except ValueError:
        raise SystemExit(f"--shapes: one of {', '.join(SHAPE_SETS)} or NxK,NxK,...; got {spec!r}") from None


def warm(share, dev, wide, shapes, buckets=M_BUCKETS, unsync=False):
    i, n = (int(v) for v in share.split("/"))
    jobs = [(path, M, N, K, c) for (N, K) in shapes for M in buckets for path in ("w8a8", "w8a16")
            if path == "w8a8" or M <= W8A16_MAX_M for c in candidates(path, M, N, K, wide, unsync)]
    seen = set()
    for j, (path, M, N, K, c) in enumerate(jobs):
        key = (path, tuple(sorted((k, v > 1 if k == "SPLIT_K" else v) for k, v in c.items())))  # compiled variants
        if key in seen:
            continue
        seen.add(key)
        if len(seen) % n != i:
            continue
        packs, _ = make_weights(N, K, 1, dev)
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        fn = int8_outlier_linear_triton if path == "w8a8" else int8_weight_only_linear_triton
        try:
            fn(x, packs[0], c)
        except Exception as e:  # noqa: BLE001
            print("warm fail", path, c, type(e).__name__, flush=True)
    torch.cuda.synchronize()


def render(tables):
    """The generated block of configs.py: one ``TABLES[device] = {...}`` per GPU."""
    lines = ["TABLES: dict = {}"]
    for name, table in tables.items():
        lines += [f"TABLES[{name!r}] = {{", *(f"    {k!r}: {v!r}," for k, v in table.items()), "}"]
    return "\n".join(lines) + "\n"


def apply(table_file, merge=lambda committed, swept: {**committed, **swept}):
    """``table_file``'s tables into kernels/gemm/configs.py's generated block: each GPU's entries as ``merge(committed
    entries, swept entries)`` (default: the swept entries over the committed ones, whose others stay)."""
    path = os.path.join(os.path.dirname(__file__), "..", "kernels", "gemm", "configs.py")
    begin, end = "# --- generated by tools/sweep_gemm.py: begin ---\n", "# --- generated by tools/sweep_gemm.py: end ---"
    src = open(path).read()
    a, b = src.index(begin) + len(begin), src.index(end)
    committed, swept = {}, {"TABLES": {}}
    exec(src[a:b], committed)  # this tool's own output: dict literals
    exec(open(table_file).read(), swept)
    tables = dict(committed["TABLES"])
    for name, entries in swept["TABLES"].items():
        tables[name] = merge(tables.get(name, {}), entries)
    text = src[:a] + render(tables) + src[b:]
    with open(path, "w") as f:  # opened (emptied) only once the new file is whole
        f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--warm", default=None)
    ap.add_argument("--apply", default=None)
    ap.add_argument("--wide", action="store_true", help="a wider tile space: warps, pipeline depth, BN = 16")
    ap.add_argument("--shapes", default="default", help=f"N x K weights: {', '.join(SHAPE_SETS)} or NxK,NxK,...")
    ap.add_argument("--unsync", action="store_true", help="the tiles past Triton's synchronous int8 wgmma only")
    ap.add_argument("--buckets", default=None, help="M buckets to sweep, e.g. 64,128,256 (default: all)")
    args = ap.parse_args()
    shapes = parse_shapes(args.shapes)
    buckets = tuple(int(b) for b in args.buckets.split(",")) if args.buckets else M_BUCKETS
    if not set(buckets) <= set(M_BUCKETS):
        raise SystemExit(f"--buckets: each one of {M_BUCKETS}; got {args.buckets!r}")
    if args.apply:
        return apply(args.apply)
    dev = torch.device("cuda")
    if args.warm:
        return warm(args.warm, dev, args.wide, shapes, buckets, args.unsync)
    name = torch.cuda.get_device_name(dev)
    slug = "h200" if "H200" in name else "h100" if "H100" in name else name.lower().replace(" ", "_")
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(big)
    copy_gbs = 2 * big.numel() / (do_bench(lambda: dst.copy_(big), return_mode="median") * 1e-3) / 1e9
    del big, dst
    y0 = torch.empty(1, device=dev)
    floor_us = bench(lambda: _empty_kernel[(1,)](y0))
    print(f"{name}: copy {copy_gbs:.0f} GB/s (read + write); one empty Triton launch in a graph {floor_us:.2f} us",
          flush=True)
    rows, table = [], {}
    t0 = time.time()
    for N, K in shapes:
        copies = max(2, math.ceil(STREAM_BYTES / (N * K)))
        packs, keep_idx = make_weights(N, K, copies, dev)
        wbf = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
               for _ in range(max(2, math.ceil(STREAM_BYTES / (2 * N * K))))]
        KQ = packs[0].qweight.shape[1]
        w8_bytes = N * KQ + 4 * N + 2 * N * N_OUT
        for M in buckets:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            x[:, packs[0].outlier_idx.long()] *= 30
            act_bytes = 2 * M * K + 2 * M * N
            ref = reference(x, packs[0], keep_idx)
            rec = dict(N=N, K=K, M=M, n_outliers=N_OUT)
            rec["cublas_bf16_us"] = bench(rotating(lambda w: F.linear(x, w), wbf))
            rec["cublas_GBps"] = (2 * N * K + act_bytes) / rec["cublas_bf16_us"] / 1e3
            old = tiled_config(M)
            rec["w8a8_old_us"] = bench(rotating(lambda p: int8_outlier_linear_triton(x, p, old), packs))
            rec["w8a8_old_config"] = old
            codes = quantize_rows(x, packs[0])
            y = torch.empty(M, N, device=dev, dtype=x.dtype)
            rec["quantize_rows_us"] = bench(lambda: quantize_rows(x, packs[0]))

            def gemm_alone(p, c):
                int8_gemm(*codes, p, y, c)
                return y

            for path, fn in (("w8a8", gemm_alone), ("w8a16", lambda p, c: int8_weight_only_linear_triton(x, p, c))):
                if path == "w8a16" and M > W8A16_MAX_M:
                    # not swept here: the committed tiles stay (--apply writes the entry back as it was)
                    rec["w8a16_us"], rec["w8a16_rel_err"] = math.inf, None
                    rec["w8a16_config"] = choose_config("w8a16", M, N, K, name)
                    rec["w8a16_rejected"] = []
                    continue
                committed = choose_config(path, M, N, K, name)
                rec[f"{path}_committed_config"] = committed
                rec[f"{path}_committed_us"] = math.inf  # timed below as the first candidate (inf: it failed)
                best, errs = None, []
                for c in [committed] + candidates(path, M, N, K, args.wide, args.unsync):
                    try:
                        err = rel(fn(packs[0], c).clone(), ref)
                        if not err < 2e-2:
                            errs.append((c, err))
                            continue
                        us = bench(rotating(lambda p: fn(p, c), packs))  # noqa: B023
                    except Exception as e:  # noqa: BLE001
                        errs.append((c, type(e).__name__))
                        continue
                    if c is committed:
                        rec[f"{path}_committed_us"] = us
                    if best is None or us < best[0]:
                        best = (us, c, err)
                rec[f"{path}_us"], rec[f"{path}_config"], rec[f"{path}_rel_err"] = best
                rec[f"{path}_rejected"] = [f"{c}: {e}" for c, e in errs]
            rec["w8a8_gemm_alone_us"] = rec["w8a8_us"]
            rec["w8a8_us"] = rec["w8a8_gemm_alone_us"] + rec["quantize_rows_us"]  # a module called on its own
            rec["w8a8_gemm_alone_pct_copy"] = 100 * (w8_bytes + M * KQ + 2 * M * N) / rec["w8a8_gemm_alone_us"] / 1e3 / copy_gbs
            rec["w8a8_gemm_alone_vs_cublas"] = rec["cublas_bf16_us"] / rec["w8a8_gemm_alone_us"]
            for key in ("w8a8_old", "w8a8", "w8a16"):
                rec[f"{key}_GBps"] = (w8_bytes + act_bytes) / rec[f"{key}_us"] / 1e3
                rec[f"{key}_pct_copy"] = 100 * rec[f"{key}_GBps"] / copy_gbs
                rec[f"{key}_vs_cublas"] = rec["cublas_bf16_us"] / rec[f"{key}_us"]
            rec["chosen"] = "w8a16" if rec["w8a16_us"] < rec["w8a8_us"] else "w8a8"
            table[f"{M}@{N}x{K}"] = {"path": rec["chosen"], "w8a8": rec["w8a8_config"], "w8a16": rec["w8a16_config"]}
            rows.append(rec)
            print(f"N={N} K={K} M={M}: cublas {rec['cublas_bf16_us']:.2f}  old {rec['w8a8_old_us']:.2f}  "
                  f"w8a8 {rec['w8a8_us']:.2f} {rec['w8a8_config']}  w8a16 {rec['w8a16_us']:.2f} "
                  f"{rec['w8a16_config']}  [{time.time() - t0:.0f}s]", flush=True)
        del packs, wbf
    meta = dict(device=name, torch=torch.__version__, triton=triton.__version__, copy_GBps=copy_gbs,
                empty_launch_us=floor_us, wide=args.wide, unsync=args.unsync,
                shapes=shapes, M=list(buckets), n_outliers=N_OUT, x_dtype="bfloat16",
                timing="do_bench_cudagraph(rep=5) median; weights rotated over > 160 MB of copies; W8A8 tiles "
                       "chosen by the GEMM alone on pre-made codes, w8a8_us adds one quantize_rows pass")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"gemm_decode_{slug}.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    with open(os.path.join(args.out, "configs_table.py"), "w") as f:
        f.write(render({name: table}).split("\n", 1)[1])  # TABLES[name] = {...}
    lines = [f"# int8 GEMM at decode sizes: {name}", "",
             f"torch {torch.__version__}, triton {triton.__version__}; copy bandwidth {copy_gbs:.0f} GB/s "
             f"(read + write); one empty Triton kernel in a CUDA graph: {floor_us:.2f} us; x bf16, "
             f"{N_OUT} outlier columns, no bias; CUDA-graph median, weights streamed from device memory "
             "(rotated copies). `GEMM alone` is what the model runs (codes written by the producer); "
             "`% copy` counts its int8 weight + codes + output bytes; `auto` is a module called on its own "
             "(quantize_rows + GEMM, or W8A16 where the table picks it). `x cuBLAS` = cuBLAS bf16 time / "
             "ours (> 1 is faster). W8A16 was swept at M <= 16 only.", "",
             "| N x K | M | cuBLAS bf16 us | committed GEMM us | GEMM alone us | % copy | x cuBLAS | tiles | "
             "quantize_rows us | W8A16 us | auto path | auto x cuBLAS |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["chosen"]
        cfg = r["w8a8_config"]
        tiles = ("tiled" if "GROUP_M" in cfg else
                 f"{'swap ' if cfg.get('SWAP_AB') else ''}{cfg['BM']}x{cfg['BN']}x{cfg['BK']} split {cfg['SPLIT_K']} "
                 f"w{cfg['num_warps']} s{cfg['num_stages']}")
        w16 = f"{r['w8a16_us']:.2f}" if math.isfinite(r["w8a16_us"]) else "-"
        lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {r['cublas_bf16_us']:.2f} | {r['w8a8_committed_us']:.2f} | "
                     f"{r['w8a8_gemm_alone_us']:.2f} | "
                     f"{r['w8a8_gemm_alone_pct_copy']:.0f}% | {r['w8a8_gemm_alone_vs_cublas']:.2f} | {tiles} | "
                     f"{r['quantize_rows_us']:.2f} | {w16} | {c} | {r[f'{c}_vs_cublas']:.2f} |")
    lines += ["", "Configs (best of the sweep):", ""]
    for r in rows:
        lines.append(f"- {r['N']}x{r['K']} M={r['M']}: w8a8 `{r['w8a8_config']}`, w8a16 `{r['w8a16_config']}`")
    with open(os.path.join(args.out, f"gemm_decode_{slug}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:len(rows) + 6]))


if __name__ == "__main__":
    main()
