"""A MoE layer's routed experts with int8 weights on the GPU: two grouped GEMMs over the tokens sorted by expert.

Spec: :func:`.reference.int8_experts`. The ``T x k`` (token, expert) pairs are sorted by expert and each expert's
pairs padded to whole blocks of ``BLOCK_M`` rows (:func:`align_pairs`: PyTorch operations of fixed shapes, no
host synchronization, so a decode step holding them replays as a CUDA graph). A program takes one block, so one
expert, and a tile of output channels; it reads that expert's int8 weights once for the block's rows and turns
them into the activations' dtype for the tensor cores (int8 values are exact in bf16), with float32 sums and the
per-channel scales applied after the sum.

* ``_experts_in_kernel``: the expert's input projection (gate and up rows at once where gated) and the
  activation, writing each pair's ``a`` in x's dtype;
* ``_experts_out_kernel``: the down projection times the routing weight, each pair's ``y`` in float32; the ``k``
  pairs of a token are summed after, in float32.

Blocks past the used experts' (the grid is sized for the worst case) return at once. The tiles are not swept
yet; what they are chosen by is :func:`_tiles`.
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.sizes import cdiv
from .reference import check_experts

try:
    import triton
    import triton.language as tl
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def align_pairs(top_k_index: torch.Tensor, num_experts: int, block_m: int):
    """The (token, expert) pairs sorted by expert, each expert's padded to whole blocks of ``block_m``:
    ``(pairs [n_blocks * block_m] int32, block_expert [n_blocks] int32)``, a pair as ``token * k + j``, padding
    rows as ``T * k``, and blocks past the last used expert's as expert ``num_experts``. ``n_blocks`` is the
    worst case of the routing, ``cdiv(T * k, block_m) + min(num_experts, T * k)``, so the shapes depend on
    ``T``, ``k`` and the experts alone."""
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
    n_blocks = cdiv(S, block_m) + min(num_experts, S)
    pairs = torch.full((n_blocks * block_m,), S, dtype=torch.int32, device=device)
    pairs.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(n_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True).to(torch.int32)
    return pairs, block_expert


if triton is not None:

    @triton.jit
    def _activate(h, ACT: tl.constexpr):
        if ACT == "silu":
            return h / (1.0 + tl.exp(-h))
        else:  # relu2
            r = tl.maximum(h, 0.0)
            return r * r

    @triton.jit
    def _block(block_expert_ptr, pairs_ptr, S, BLOCK_M: tl.constexpr):
        """This program's block: its expert (past the last used one: no work), its pairs (padding rows as ``S``)
        and which of them are real."""
        pid_m = tl.program_id(0)
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        pair = tl.load(pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        return expert, pair, pair < S

    @triton.jit
    def _experts_in_kernel(x_ptr, w_ptr, s_ptr, pairs_ptr, block_expert_ptr, a_ptr, S, H, I, E, s_xt, limit,
                           TOPK: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, LIMIT: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           PRECISION: tl.constexpr):
        expert, pair, valid = _block(block_expert_ptr, pairs_ptr, S, BLOCK_M)
        if expert >= E:
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
                            PRECISION: tl.constexpr):
        expert, pair, valid = _block(block_expert_ptr, pairs_ptr, S, BLOCK_M)
        if expert >= E:
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
        routing = tl.load(rw_ptr + rows, mask=valid, other=0.0)
        y = acc * tl.load(s_ptr + expert * H + n, mask=n_ok, other=0.0)[None, :] * routing[:, None]
        tl.store(y_ptr + rows[:, None] * H + n[None, :], y, mask=valid[:, None] & n_ok[None, :])


def _tiles(pairs: int, num_experts: int) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K)``: 16-row blocks where an expert gets a few pairs (decode: the weights' bytes
    bound the step, padding rows cost no bytes), 64 where it gets many (prefill)."""
    if pairs <= 16 * num_experts:
        return 16, 64, 128
    return 64, 128, 64


def int8_experts_triton(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                        in_codes: torch.Tensor, in_scale: torch.Tensor, out_codes: torch.Tensor,
                        out_scale: torch.Tensor, activation: str, gated: bool,
                        limit: float | None = None) -> torch.Tensor:
    """Twin of :func:`.reference.int8_experts`, two launches and the pairs' sum. ``x`` may have any row stride;
    the weights and scales must be contiguous."""
    check_experts(x, top_k_index, top_k_weights, in_codes, in_scale, out_codes, out_scale, activation, gated)
    if x.stride(1) != 1 or not all(t.is_contiguous() for t in (in_codes, in_scale, out_codes, out_scale)):
        raise ValueError("the kernels need x's columns and the expert weights and scales contiguous")
    T, k = top_k_index.shape
    E, H, I = out_codes.shape
    S = T * k
    if S == 0:
        return torch.zeros_like(x)
    block_m, block_n, block_k = _tiles(S, E)
    pairs, block_expert = align_pairs(top_k_index, E, block_m)
    n_blocks = block_expert.numel()
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    a = torch.empty(S, I, dtype=x.dtype, device=x.device)
    launch_kernel(_experts_in_kernel, (n_blocks, cdiv(I, block_n)), x, in_codes, in_scale, pairs, block_expert, a,
                  S, H, I, E, x.stride(0), float(limit or 0.0), TOPK=k, GATED=gated, ACT=activation,
                  LIMIT=limit is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision,
                  num_warps=4, num_stages=3)
    y = torch.empty(S, H, dtype=torch.float32, device=x.device)
    routing = top_k_weights.reshape(-1).float()
    launch_kernel(_experts_out_kernel, (n_blocks, cdiv(H, block_n)), a, out_codes, out_scale, routing, pairs,
                  block_expert, y, S, H, I, E, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                  PRECISION=precision, num_warps=4, num_stages=3)
    return y.view(T, k, H).sum(1).to(x.dtype)
