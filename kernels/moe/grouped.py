"""A MoE layer's routed experts with int8 weights on the GPU: two grouped GEMMs over the tokens grouped by expert.

Spec: :func:`.reference.int8_experts`. The ``T x k`` (token, expert) pairs are grouped by expert and each expert's
pairs padded to whole blocks of ``BLOCK_M`` rows (:func:`align_pairs`: one launch of fixed shapes, no host
synchronization, so a decode step holding it replays as a CUDA graph; one token's pairs need none: each is a block
of its own). A program takes one block, so one expert, and a tile of output channels; it reads that expert's int8
weights once for the block's rows and turns them into the activations' dtype for the tensor cores (int8 values are
exact in bf16), with float32 sums and the per-channel scales applied after the sum.

* ``_experts_in_kernel``: the expert's input projection (gate and up rows at once where gated) and the
  activation, writing each pair's ``a`` in x's dtype;
* ``_experts_out_kernel``: the down projection times the routing weight, each pair's ``y`` in float32;
* ``_sum_pairs_kernel``: a token's ``k`` pairs summed in float32 and rounded to x's dtype (where nothing else
  reads the sum: :func:`int8_expert_pairs_triton`).

Blocks past the used experts' (the grid is sized for the worst case) return at once. The tiles are chosen by
:func:`_tiles`'s rule; ``tools/bench_moe_experts.py --sweep`` times others.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..common.launch import launch_kernel
from ..common.sizes import cdiv, sm_count
from .reference import check_experts

try:
    import triton
    import triton.language as tl
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def _n_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    return cdiv(pairs, block_m) + min(num_experts, pairs)


def align_pairs_reference(top_k_index: torch.Tensor, num_experts: int, block_m: int):
    """Spec of :func:`align_pairs` (PyTorch, ~20 launches): the (token, expert) pairs sorted by expert, each
    expert's padded to whole blocks of ``block_m``: ``(pairs [n_blocks * block_m] int32, block_expert [n_blocks]
    int32)``, a pair as ``token * k + j``, padding rows as ``T * k``, and blocks past the last used expert's as
    expert ``num_experts``. ``n_blocks`` is the worst case of the routing, :func:`_n_blocks`, so the shapes depend
    on ``T``, ``k`` and the experts alone. Here an expert's pairs keep their order; the kernel's may not, which
    changes no result: a row's sums do not depend on the rows beside it."""
    expert_of_pair = top_k_index.reshape(-1).long()
    S, device = expert_of_pair.numel(), expert_of_pair.device
    sorted_expert, order = torch.sort(expert_of_pair, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, expert_of_pair, torch.ones_like(expert_of_pair))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    first = counts.cumsum(0) - counts  # each expert's first pair in sorted order
    rank = torch.arange(S, device=device) - first[sorted_expert]
    dest = padded_end[sorted_expert] - padded[sorted_expert] + rank
    n_blocks = _n_blocks(S, num_experts, block_m)
    pairs = torch.full((n_blocks * block_m,), S, dtype=torch.int32, device=device)
    pairs.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(n_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True).to(torch.int32)
    return pairs, block_expert


if triton is not None:

    @triton.jit
    def _align_kernel(expert_ptr, pairs_ptr, block_expert_ptr, end_ptr, cursor_ptr, S, E, n_blocks,
                      BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
        """One program: :func:`align_pairs_reference` in one launch. Counts by atomics, each expert's padded
        range by a running cumsum, then each pair takes the next row of its expert's range by an atomic; the
        barriers order the phases (one block of threads)."""
        c = tl.arange(0, CHUNK)
        for e0 in range(0, E, CHUNK):
            tl.store(end_ptr + e0 + c, tl.zeros([CHUNK], tl.int32), mask=e0 + c < E)
        for r0 in range(0, n_blocks * BLOCK_M, CHUNK):
            tl.store(pairs_ptr + r0 + c, tl.full([CHUNK], 0, tl.int32) + S, mask=r0 + c < n_blocks * BLOCK_M)
        tl.debug_barrier()
        for s0 in range(0, S, CHUNK):
            expert = tl.load(expert_ptr + s0 + c, mask=s0 + c < S, other=-1)
            ok = (expert >= 0) & (expert < E)  # no write outside the counts, whatever the indices
            tl.atomic_add(end_ptr + expert, tl.full([CHUNK], 1, tl.int32), mask=ok)
        tl.debug_barrier()
        total = tl.sum(tl.zeros([CHUNK], tl.int32), 0)
        for e0 in range(0, E, CHUNK):
            ok = e0 + c < E
            count = tl.load(end_ptr + e0 + c, mask=ok, other=0, cache_modifier=".cg")  # the atomics' sums, in L2
            padded = (count + BLOCK_M - 1) // BLOCK_M * BLOCK_M
            end = tl.cumsum(padded, 0) + total
            tl.store(cursor_ptr + e0 + c, end - padded, mask=ok)
            tl.store(end_ptr + e0 + c, end, mask=ok)
            total += tl.sum(padded, 0)
        tl.debug_barrier()
        for s0 in range(0, S, CHUNK):
            expert = tl.load(expert_ptr + s0 + c, mask=s0 + c < S, other=-1)
            ok = (expert >= 0) & (expert < E)
            row = tl.atomic_add(cursor_ptr + expert, tl.full([CHUNK], 1, tl.int32), mask=ok)
            tl.store(pairs_ptr + row, s0 + c, mask=ok)
        # a block's expert: how many experts' ranges end at or before its first row (E past the last)
        b = tl.arange(0, 32)
        for b0 in range(0, n_blocks, 32):
            first_row = (b0 + b) * BLOCK_M
            before = tl.zeros([32], tl.int32)
            for e0 in range(0, E, CHUNK):
                end = tl.load(end_ptr + e0 + c, mask=e0 + c < E, other=2**31 - 1, cache_modifier=".cg")
                before += tl.sum((end[None, :] <= first_row[:, None]).to(tl.int32), 1)
            tl.store(block_expert_ptr + b0 + b, before, mask=b0 + b < n_blocks)

    @triton.jit
    def _activate(h, ACT: tl.constexpr):
        if ACT == "silu":
            return h / (1.0 + tl.exp(-h))
        else:  # relu2
            r = tl.maximum(h, 0.0)
            return r * r

    @triton.jit
    def _block(block_expert_ptr, pairs_ptr, S, BLOCK_M: tl.constexpr, DIRECT: tl.constexpr):
        """This program's block: its expert (past the last used one: no work), its pairs (padding rows as ``S``)
        and which of them are real. ``DIRECT`` (one token): block ``j`` is pair ``j`` alone and ``block_expert_ptr``
        the router's top-k indices, so no alignment ran (a router's k experts are distinct; an expert chosen twice
        would be read twice, still right)."""
        pid_m = tl.program_id(0)
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        if DIRECT:
            row = tl.arange(0, BLOCK_M)
            pair = tl.where(row == 0, pid_m, S)
        else:
            pair = tl.load(pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        return expert, pair, pair < S

    @triton.jit
    def _experts_in_kernel(x_ptr, w_ptr, s_ptr, pairs_ptr, block_expert_ptr, a_ptr, S, H, I, E, s_xt, limit,
                           TOPK: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, LIMIT: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           PRECISION: tl.constexpr, DIRECT: tl.constexpr):
        expert, pair, valid = _block(block_expert_ptr, pairs_ptr, S, BLOCK_M, DIRECT)
        if (expert < 0) | (expert >= E):
            return
        token = (pair // TOPK).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < I
        n_rows = 2 * I if GATED else I
        w_rows = w_ptr + expert * n_rows * H + n[None, :].to(tl.int64) * H
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < H
            a = tl.load(x_ptr + token[:, None] * s_xt + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
            w_mask = k_ok[:, None] & n_ok[None, :]
            w = tl.load(w_rows + k[:, None], mask=w_mask, other=0).to(a.dtype)
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
            if GATED:
                w_up = tl.load(w_rows + I * H + k[:, None], mask=w_mask, other=0).to(a.dtype)
                acc_up = tl.dot(a, w_up, acc_up, input_precision=PRECISION)
        scales = s_ptr + expert * n_rows + n
        h = acc * tl.load(scales, mask=n_ok, other=0.0)[None, :]
        out = _activate(h, ACT)
        if GATED:
            up = acc_up * tl.load(scales + I, mask=n_ok, other=0.0)[None, :]
            if LIMIT:
                out = tl.minimum(out, limit)
                up = tl.minimum(tl.maximum(up, -limit), limit)
            out = out * up
        tl.store(a_ptr + pair[:, None].to(tl.int64) * I + n[None, :], out.to(a_ptr.dtype.element_ty),
                 mask=valid[:, None] & n_ok[None, :])

    @triton.jit
    def _experts_out_kernel(a_ptr, w_ptr, s_ptr, rw_ptr, pairs_ptr, block_expert_ptr, y_ptr, S, H, I, E,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            PRECISION: tl.constexpr, DIRECT: tl.constexpr):
        expert, pair, valid = _block(block_expert_ptr, pairs_ptr, S, BLOCK_M, DIRECT)
        if (expert < 0) | (expert >= E):
            return
        rows = pair.to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < H
        w_rows = w_ptr + expert * H * I + n[None, :].to(tl.int64) * I
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < I
            a = tl.load(a_ptr + rows[:, None] * I + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0).to(a.dtype)
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
        routing = tl.load(rw_ptr + rows, mask=valid, other=0.0).to(tl.float32)
        y = acc * tl.load(s_ptr + expert * H + n, mask=n_ok, other=0.0)[None, :] * routing[:, None]
        tl.store(y_ptr + rows[:, None] * H + n[None, :], y, mask=valid[:, None] & n_ok[None, :])


    @triton.jit
    def summed_pairs(y_ptr, t, h, ok, H, TOPK: tl.constexpr):
        """Columns ``h`` of token ``t``'s ``TOPK`` pairs (``y [T * TOPK, H]`` float32) summed in float32, in their
        order: what :func:`_sum_pairs_kernel` rounds and stores, and the gated shared sum
        (:mod:`laquant.kernels.moe.combine`) reads in its place."""
        acc = tl.load(y_ptr + t * TOPK * H + h, mask=ok, other=0.0)
        for i in tl.static_range(1, TOPK):
            acc += tl.load(y_ptr + (t * TOPK + i) * H + h, mask=ok, other=0.0)
        return acc

    @triton.jit
    def _sum_pairs_kernel(y_ptr, out_ptr, H, TOPK: tl.constexpr, BLOCK_H: tl.constexpr):
        """A token's ``TOPK`` pairs summed in float32, in their order, and rounded to the output's dtype."""
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        ok = h < H
        tl.store(out_ptr + t * H + h, summed_pairs(y_ptr, t, h, ok, H, TOPK).to(out_ptr.dtype.element_ty), mask=ok)


def align_pairs(top_k_index: torch.Tensor, num_experts: int, block_m: int):
    """:func:`align_pairs_reference` in one launch (the spec's ~20 took most of a decode-sized experts call's time:
    ~50 us of 70 on the H200)."""
    expert_of_pair = top_k_index.reshape(-1).contiguous()
    S, device = expert_of_pair.numel(), expert_of_pair.device
    n_blocks = _n_blocks(S, num_experts, block_m)
    pairs = torch.empty(n_blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=device)
    scratch = torch.empty(2, num_experts, dtype=torch.int32, device=device)
    launch_kernel(_align_kernel, (1,), expert_of_pair, pairs, block_expert, scratch[0], scratch[1], S, num_experts,
                  n_blocks, BLOCK_M=block_m, CHUNK=256, num_warps=8)
    return pairs, block_expert


class Tiles(NamedTuple):
    block_m: int
    block_n_in: int  # the input projection's output channels a program takes
    block_n_out: int  # the down projection's
    block_k: int
    num_warps: int = 4


def _tiles(pairs: int, num_experts: int, I: int, H: int, sms: int) -> Tiles:
    """Blocks of 16 rows where an expert gets a few pairs (decode: the weights' bytes bound the call and padding
    rows cost none), 32 or 64 where it gets more. The output tiles follow the H200 sweep of 2026-12-05
    (``eval/results/moe_experts_h200/run2/``: within 5% of the best of 36 at every decode size swept, T = 1-64 on
    three released layer shapes): at decode sizes narrow input-projection tiles (32 channels) where a 16-row block
    has few rows, 64 and 128 once the blocks alone fill the SMs; above 32 rows a block, the widest tile that still
    gives two programs an SM (MiniMax's 4 wide experts ran 44 programs at 64 tokens with 128)."""
    used = min(num_experts, pairs)
    per_expert = cdiv(pairs, used)
    block_m = 16 if per_expert <= 16 else 32 if per_expert <= 32 else 64
    blocks = max(used, cdiv(pairs, block_m))
    if block_m == 64:
        def block_n(n):
            return next((b for b in (128, 64) if blocks * cdiv(n, b) >= 2 * sms), 32)

        return Tiles(64, block_n(I), block_n(H), 64)
    if blocks >= sms:
        return Tiles(block_m, 64, 128, 128)
    return Tiles(block_m, 32 if block_m == 16 else 64, 64, 128)


# above this many pairs the one-program alignment is slower than its PyTorch spec's launches (0.36 against 0.13 ms at
# 40,960 pairs, 0.047 against 0.12 at 8,192 on the H200): a prefill's
ALIGN_ONE_LAUNCH_MAX_PAIRS = 8192


def int8_experts_triton(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                        in_codes: torch.Tensor, in_scale: torch.Tensor, out_codes: torch.Tensor,
                        out_scale: torch.Tensor, activation: str, gated: bool,
                        limit: float | None = None, tiles: Tiles | None = None) -> torch.Tensor:
    """Twin of :func:`.reference.int8_experts` in four launches (the alignment, the two GEMMs, the pairs' sum and
    cast; PyTorch's sum and cast were two), three for one token (each pair its own block, no alignment: ~4.6 us a
    MoE layer of a one-token decode step on the H200). ``x`` may have any row stride;
    the weights and scales must be contiguous. ``top_k_index`` must lie in ``[0, E)``, as a router's top-k over the
    E experts does (not checked: that would synchronize with the host; transformers' expert-parallel sentinels are
    not taken). ``tiles``: :func:`_tiles`'s choice unless given (a sweep's)."""
    T, k = top_k_index.shape
    if T * k == 0:
        check_experts(x, top_k_index, top_k_weights, in_codes, in_scale, out_codes, out_scale, activation, gated)
        return torch.zeros_like(x)
    return sum_pairs_triton(int8_expert_pairs_triton(x, top_k_index, top_k_weights, in_codes, in_scale, out_codes,
                                                     out_scale, activation, gated, limit, tiles), k, x.dtype)


def sum_pairs_triton(y: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """Each token's ``k`` pairs of ``y [T * k, H]`` (float32, contiguous) summed in float32 in their order and rounded
    to ``dtype``: ``[T, H]``, one launch."""
    H = y.shape[1]
    T = y.shape[0] // k
    out = torch.empty(T, H, dtype=dtype, device=y.device)
    launch_kernel(_sum_pairs_kernel, (T, cdiv(H, 1024)), y, out, H, TOPK=k, BLOCK_H=1024, num_warps=4)
    return out


def int8_expert_pairs_triton(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                             in_codes: torch.Tensor, in_scale: torch.Tensor, out_codes: torch.Tensor,
                             out_scale: torch.Tensor, activation: str, gated: bool,
                             limit: float | None = None, tiles: Tiles | None = None) -> torch.Tensor:
    """:func:`int8_experts_triton` before its last launch: each (token, expert) pair's output times its routing
    weight, ``[T * k, H]`` float32 (pair ``t * k + j``), which that launch sums per token in order
    (:func:`summed_pairs`) and rounds to x's dtype. A kernel that reads the sum anyway (the shared expert's gated
    sum, :func:`laquant.kernels.moe.combine.gated_shared_sum_triton`) takes these in its place, one launch less.
    The arguments are :func:`int8_experts_triton`'s; at least one pair."""
    check_experts(x, top_k_index, top_k_weights, in_codes, in_scale, out_codes, out_scale, activation, gated)
    if x.stride(1) != 1 or not all(t.is_contiguous() for t in (in_codes, in_scale, out_codes, out_scale)):
        raise ValueError("the kernels need x's columns and the expert weights and scales contiguous")
    T, k = top_k_index.shape
    E, H, I = out_codes.shape
    S = T * k
    if S == 0:
        raise ValueError("no (token, expert) pair to compute")
    tiles = tiles or _tiles(S, E, I, H, sm_count(x.device, 132))
    direct = T == 1  # a token's k experts are distinct: a block a pair, in the router's order
    if direct:
        pairs, block_expert = top_k_index, top_k_index.reshape(-1).contiguous()
    else:
        align = align_pairs if S <= ALIGN_ONE_LAUNCH_MAX_PAIRS else align_pairs_reference
        pairs, block_expert = align(top_k_index, E, tiles.block_m)
    n_blocks = block_expert.numel()
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    common = dict(BLOCK_M=tiles.block_m, BLOCK_K=tiles.block_k, PRECISION=precision, num_warps=tiles.num_warps,
                  num_stages=3, DIRECT=direct)
    a = torch.empty(S, I, dtype=x.dtype, device=x.device)
    launch_kernel(_experts_in_kernel, (n_blocks, cdiv(I, tiles.block_n_in)), x, in_codes, in_scale, pairs,
                  block_expert, a, S, H, I, E, x.stride(0), float(limit or 0.0), TOPK=k, GATED=gated,
                  ACT=activation, LIMIT=limit is not None, BLOCK_N=tiles.block_n_in, **common)
    y = torch.empty(S, H, dtype=torch.float32, device=x.device)
    routing = top_k_weights.reshape(-1)  # read in its dtype, turned to float32 in the kernel
    launch_kernel(_experts_out_kernel, (n_blocks, cdiv(H, tiles.block_n_out)), a, out_codes, out_scale, routing,
                  pairs, block_expert, y, S, H, I, E, BLOCK_N=tiles.block_n_out, **common)
    return y
