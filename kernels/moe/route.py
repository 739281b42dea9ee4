"""A MoE router's choice of experts in one launch: its logits -> the top k experts of each token and their weights.

Spec: :func:`.reference.route` (transformers' routers' formulas, :data:`.reference.ROUTINGS`). transformers runs
them as 6-15 PyTorch launches a layer (softmax, a top-k with its sort, the sum, the division, the cast; the grouped
routers' group scores, masks and second top-k), ~17 us of a one-token decode step's MoE layer on an H200 against
~5 for the router's GEMM. Here one program takes one token's row of logits.

The same numbers, computed another way: float32 throughout, ``exp`` as CUDA's ``expf``
(:func:`~laquant.kernels.common.triton_numerics.exp_as_torch`), divisions rounded as IEEE's; the top k by k passes
of an arg-max (ties: the lower expert index, as CUDA's top-k takes the k-th value's ties); NaN logits chosen first,
as ``torch.topk`` ranks NaN. Sums of the k weights run in the order chosen, which may differ from PyTorch's
reduction by an ulp of float32.
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.sizes import next_power_of_2
from .reference import ROUTINGS, check_route

try:
    import triton
    import triton.language as tl
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

if triton is not None:
    from ..common.triton_numerics import exp_as_torch

    @triton.jit
    def _max2(x):
        return tl.max(tl.max(x, axis=1), axis=0)

    @triton.jit
    def _sum2(x):
        return tl.sum(tl.sum(x, axis=1), axis=0)

    @triton.jit
    def _route_kernel(logits_ptr, bias_ptr, w_ptr, idx_ptr, E, s_lt, scale, K: tl.constexpr, ROUTING: tl.constexpr,
                      RENORM: tl.constexpr, G: tl.constexpr, TOPK_GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                      BLOCK_EG: tl.constexpr, BLOCK_K: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        EG = E // G
        g = tl.arange(0, BLOCK_G)[:, None]
        j = tl.arange(0, BLOCK_EG)[None, :]
        e = g * EG + j  # expert e sits at (e // EG, e % EG): each row one group (one row when not grouped)
        valid = (g < G) & (j < EG)
        x = tl.load(logits_ptr + t * s_lt + e, mask=valid, other=0.0).to(tl.float32)
        if ROUTING == 0:  # softmax; chosen by probability, as transformers' top-k of the probabilities
            m = _max2(tl.where(valid, x, float("-inf")))
            ex = tl.where(valid, exp_as_torch(x - m), 0.0)
            value = tl.math.div_rn(ex, tl.broadcast_to(_sum2(ex), ex.shape))
            rank = value
        elif ROUTING == 1:  # topk_softmax: chosen by logit
            value = x
            rank = x
        else:  # grouped_sigmoid
            value = tl.math.div_rn(tl.full(x.shape, 1.0, tl.float32), 1.0 + exp_as_torch(-x))
            rank = value + tl.load(bias_ptr + e, mask=valid, other=0.0).to(tl.float32)
            if G > 1:
                top1 = tl.max(tl.where(valid, rank, float("-inf")), axis=1)
                first = tl.min(tl.where(valid & (rank == top1[:, None]), j, BLOCK_EG), axis=1)
                top2 = tl.max(tl.where(valid & (j != first[:, None]), rank, float("-inf")), axis=1)
                group_score = tl.where(tl.arange(0, BLOCK_G) < G, top1 + top2, float("-inf"))
                rows = tl.arange(0, BLOCK_G)
                kept = rows < 0
                for _ in tl.static_range(TOPK_GROUP):
                    best = tl.max(tl.where(kept, float("-inf"), group_score), axis=0)
                    pick = tl.min(tl.where(~kept & (group_score == best) & (rows < G), rows, BLOCK_G), axis=0)
                    kept = kept | (rows == pick)
                valid = valid & kept[:, None]
        rank = tl.where(rank != rank, float("inf"), rank)  # NaN first, as torch.topk ranks it
        slots = tl.arange(0, BLOCK_K)
        chosen = tl.zeros([BLOCK_K], dtype=tl.float32)
        chosen_idx = tl.zeros([BLOCK_K], dtype=tl.int64)
        taken = e < 0
        for i in tl.static_range(K):
            open_ = valid & ~taken
            best = _max2(tl.where(open_, rank, float("-inf")))
            pick = tl.min(tl.min(tl.where(open_ & (rank == best), e, E), axis=1), axis=0)
            pick = tl.minimum(pick, E - 1)  # every rank -inf and none open cannot happen (check_route); stay in range
            taken = taken | (e == pick)
            chosen = tl.where(slots == i, _sum2(tl.where(e == pick, value, 0.0)), chosen)
            chosen_idx = tl.where(slots == i, pick.to(tl.int64), chosen_idx)
        in_k = slots < K
        if ROUTING == 0:
            w = chosen
            if RENORM:
                w = tl.math.div_rn(w, tl.broadcast_to(tl.sum(tl.where(in_k, w, 0.0), axis=0), w.shape))
        elif ROUTING == 1:
            ex = tl.where(in_k, exp_as_torch(chosen - tl.max(tl.where(in_k, chosen, float("-inf")), axis=0)), 0.0)
            w = tl.math.div_rn(ex, tl.broadcast_to(tl.sum(ex, axis=0), ex.shape))
        else:
            w = chosen
            if RENORM:
                w = tl.math.div_rn(w, tl.broadcast_to(tl.sum(tl.where(in_k, w, 0.0), axis=0) + 1e-20, w.shape))
            w = w * scale
        tl.store(w_ptr + t * K + slots, w.to(w_ptr.dtype.element_ty), mask=in_k)
        tl.store(idx_ptr + t * K + slots, chosen_idx, mask=in_k)


def route_triton(logits: torch.Tensor, top_k: int, routing: str, renormalize: bool = True,
                 out_dtype: torch.dtype = torch.float32, bias: torch.Tensor | None = None, n_group: int = 1,
                 topk_group: int = 1, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of :func:`.reference.route`, one launch. ``logits`` may have any row stride (its columns contiguous)."""
    check_route(logits, top_k, routing, bias, n_group, topk_group)
    if logits.stride(1) != 1:
        raise ValueError("the router kernel needs the logits' columns contiguous")
    T, E = logits.shape
    weights = torch.empty(T, top_k, dtype=out_dtype, device=logits.device)
    indices = torch.empty(T, top_k, dtype=torch.int64, device=logits.device)
    if T == 0:
        return weights, indices
    grouped = routing == "grouped_sigmoid"
    G = n_group if grouped else 1
    bias_arg = bias.contiguous() if bias is not None else logits
    block_e = next_power_of_2(E)
    launch_kernel(_route_kernel, (T,), logits, bias_arg, weights, indices, E, logits.stride(0), float(scale),
                  K=top_k, ROUTING=ROUTINGS.index(routing), RENORM=bool(renormalize), G=G,
                  TOPK_GROUP=topk_group if grouped else 1, BLOCK_G=next_power_of_2(G),
                  BLOCK_EG=next_power_of_2(E // G), BLOCK_K=next_power_of_2(top_k),
                  num_warps=4 if block_e >= 256 else 2 if block_e >= 64 else 1)
    return weights, indices
