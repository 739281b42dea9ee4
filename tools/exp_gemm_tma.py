"""An experiment for issue #14's decode GEMM (not shipped): the W8A8 split-K GEMM with its weight and activation
tiles loaded by TMA (Triton tensor descriptors, Hopper's bulk copies into shared memory with mbarriers), against
the shipped split-K kernel (``int8_gemm`` with the committed table's tiles) and cuBLAS bf16, at the 1.37B GLA
layer's four decode GEMMs and M = 1, 16, 64.

Why: ncu of the shipped kernel at M = 64 (eval/results/prefill_codes_h200/) showed its warps stalled on the cp.async
stage barrier (22%) and on fixed-latency address arithmetic (33%), one program an SM with a few KB of weight in
flight; TMA moves the loads off the warps, so a deeper pipeline of larger tiles may fit. Same numerics as the
shipped kernel (int32 sums, row x column scales, partials summed in split order by the last split to arrive).

    python tools/exp_gemm_tma.py --check            # CPU (TRITON_INTERPRET=1) or GPU: outputs against torch
    python tools/exp_gemm_tma.py --out OUT.json     # GPU: CUDA-graph medians, weights streamed from device memory
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

SHAPES = [(2048, 2048), (6144, 2048), (11264, 2048), (2048, 5632)]  # GLA 1.37B: o, q/k/v/g, gate/up, down
MS = (1, 16, 64)
# (BN, BK, SPLIT_K, stages, warps, swap): the weight tile's rows, the K step, splits, pipeline depth
CONFIGS = [(bn, bk, sk, st, w, swap) for bn, swap in ((16, False), (32, False), (64, False), (64, True), (128, True))
           for bk in (128, 256) for sk in (1, 2, 4, 8) for st in (4,) for w in (4,)]


@triton.jit(do_not_specialize=["M", "SPLIT_K"])
def _tma_splitk_kernel(w_desc, a_desc, xs_ptr, ws_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, SPLIT_K,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
                       SWAP: tl.constexpr, SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BN
    k_per = tl.cdiv(tl.cdiv(K, BK), SPLIT_K) * BK  # a multiple of BK: no tile crosses into the next split
    k_lo = pid_k * k_per
    k_hi = tl.minimum(K, k_lo + k_per)
    if SWAP:  # the weight rows on the product's tall side
        acc_t = tl.zeros([BN, BM], dtype=tl.int32)
        for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
            acc_t = tl.dot(w_desc.load([n0, k0]), tl.trans(a_desc.load([0, k0])), acc_t, out_dtype=tl.int32)
        acc = tl.trans(acc_t)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.int32)
        for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
            acc = tl.dot(a_desc.load([0, k0]), tl.trans(w_desc.load([n0, k0])), acc, out_dtype=tl.int32)
    offs_m = tl.arange(0, BM)
    offs_n = n0 + tl.arange(0, BN)
    mm = offs_m < M
    mn = offs_n < N
    y = acc.to(tl.float32) * tl.load(xs_ptr + offs_m, mask=mm, other=0.0)[:, None] * \
        tl.load(ws_ptr + offs_n, mask=mn, other=0.0)[None, :]
    mask = mm[:, None] & mn[None, :]
    out = offs_m[:, None] * N + offs_n[None, :]
    if SPLIT:  # as the shipped kernel: partials, a counter per tile, the last split sums them in split order
        MN = M * N
        tl.store(part_ptr + pid_k * MN + out, y, mask=mask)
        tl.debug_barrier()
        if tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            tot = tl.zeros([BM, BN], dtype=tl.float32)
            for s in range(0, SPLIT_K):
                tot += tl.load(part_ptr + s * MN + out, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + out, tot.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=mask)


def tma_gemm(xq, xs, w, ws, y, cfg, part=None, cnt=None):
    """``y [M, N] = (xq [M, K] int8 @ w [N, K]^T int8) * xs[:, None] * ws[None, :]`` (M <= 64)."""
    BN, BK, split, stages, warps, swap = cfg
    M, K = xq.shape
    N = w.shape[0]
    BM = max(16, triton.next_power_of_2(M))
    split = max(1, min(split, triton.cdiv(K, BK)))
    w_desc = TensorDescriptor.from_tensor(w, [BN, BK])
    a_desc = TensorDescriptor.from_tensor(xq, [BM, BK])
    if split > 1 and part is None:
        part = torch.empty(split, M, N, dtype=torch.float32, device=y.device)
        cnt = torch.zeros(triton.cdiv(N, BN), dtype=torch.int32, device=y.device)
    _tma_splitk_kernel[(triton.cdiv(N, BN), split)](
        w_desc, a_desc, xs, ws, y, part if part is not None else y, cnt if cnt is not None else xs, M, N, K, split,
        BM=BM, BN=BN, BK=BK, STAGES=stages, SWAP=swap, SPLIT=split > 1, num_warps=warps)
    return y


def _inputs(M, N, K, device, gen):
    xq = torch.randint(-127, 128, (M, K), dtype=torch.int8, device=device, generator=gen)
    w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device=device, generator=gen)
    xs = torch.rand(M, device=device, generator=gen) * 1e-2 + 1e-3
    ws = torch.rand(N, device=device, generator=gen) * 1e-3 + 1e-4
    return xq, xs, w, ws


def _reference(xq, xs, w, ws):
    return (xq.double() @ w.double().T * xs.double()[:, None] * ws.double()[None, :]).float()


def check(device) -> None:
    """Every config family on odd shapes: the outputs equal float64's products of the same int32 sums."""
    gen = torch.Generator(device=device).manual_seed(0)
    shapes = [(1, 80, 256), (5, 200, 512), (16, 64, 384), (33, 130, 1024)] if device == "cpu" else \
        [(1, 2048, 2048), (37, 6144, 2048), (64, 2048, 5632)]
    configs = [(16, 128, 1, 3, 4, False), (32, 128, 2, 3, 4, False), (64, 128, 4, 3, 4, True),
               (128, 256, 2, 3, 4, True)]
    for M, N, K in shapes:
        xq, xs, w, ws = _inputs(M, N, K, device, gen)
        want = _reference(xq, xs, w, ws)
        for cfg in configs:
            y = tma_gemm(xq, xs, w, ws, torch.empty(M, N, dtype=torch.float32, device=device), cfg)
            err = ((y - want).norm() / want.norm()).item()
            assert err < 1e-6, (M, N, K, cfg, err)
    print("check passed", flush=True)


def bench_all(out: str) -> None:
    """Timed as tools/sweep_gemm.py times the shipped kernels: CUDA-graph medians, every call on the next of several
    weight copies (> 2 x L2), so the weights stream from device memory."""
    from sweep_gemm import STREAM_BYTES, bench, rotating

    from laquant.kernels.gemm.configs import choose_config
    from laquant.kernels.common.gpus import device_name
    from laquant.kernels.gemm.int8 import PackedOutlierWeight, int8_gemm

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for N, K in SHAPES:
        copies = max(2, math.ceil(STREAM_BYTES / (N * K)))
        ws_list = [_inputs(1, N, K, dev, gen)[2:] for _ in range(copies)]
        packs = [PackedOutlierWeight.pack(w, s, torch.arange(K, device=dev), torch.empty(0, dtype=torch.long,
                                          device=dev), torch.empty(N, 0, dtype=torch.bfloat16, device=dev), None, K)
                 for w, s in ws_list]
        wbf = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(max(2, copies // 2))]
        for M in MS:
            xq, xs, _, _ = _inputs(M, N, K, dev, gen)
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            y = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
            row = dict(N=N, K=K, M=M, weight_MB=N * K / 2**20)
            row["cublas_bf16_us"] = bench(rotating(lambda w: torch.nn.functional.linear(x, w), wbf))
            cfg = choose_config("w8a8", M, N, K, device_name(dev))
            dummy = torch.empty(M, 1, dtype=torch.bfloat16, device=dev)
            row["shipped_config"] = cfg
            row["shipped_us"] = bench(rotating(lambda p: int8_gemm(xq, xs, dummy, p, y, cfg), packs))
            want = _reference(xq, xs, ws_list[0][0], ws_list[0][1])
            timed = {}
            for c in CONFIGS:
                try:
                    split = max(1, min(c[2], triton.cdiv(K, c[1])))
                    part = torch.empty(split, M, N, dtype=torch.float32, device=dev) if split > 1 else None
                    cnt = torch.zeros(triton.cdiv(N, c[0]), dtype=torch.int32, device=dev) if split > 1 else None
                    got = tma_gemm(xq, xs, ws_list[0][0], ws_list[0][1], y, c, part, cnt).float()
                    if not ((got - want).norm() / want.norm()).item() < 1e-2:
                        timed[str(c)] = "wrong"
                        continue
                    run = lambda ws: tma_gemm(xq, xs, ws[0], ws[1], y, c, part, cnt)  # noqa: B023, E731
                    timed[str(c)] = bench(rotating(run, ws_list))
                except Exception as e:  # noqa: BLE001  (a config the compiler or TMA rejects)
                    timed[str(c)] = type(e).__name__
            ok = {k: v for k, v in timed.items() if isinstance(v, float)}
            best = min(ok, key=ok.get) if ok else None
            row.update(tma_best=best, tma_best_us=ok.get(best), tma_all=timed)
            if best:
                row["tma_over_shipped"] = row["shipped_us"] / ok[best]
            print(json.dumps({k: v for k, v in row.items() if k != "tma_all"}), flush=True)
            rows.append(row)
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   rows=rows), open(out, "w"), indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    if args.check or device == "cpu":
        check(device)
    if args.out:
        bench_all(args.out)


if __name__ == "__main__":
    sys.exit(main())
