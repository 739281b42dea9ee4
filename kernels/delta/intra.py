"""Triton kernel: the chunk-local half of the gated delta rule's prefill, for every chunk at once.

With ``G`` a chunk's cumulative log-decay (one per head and token) and ``D_ij = exp(G_i - G_j)`` for
``j <= i``, everything that depends on the chunk's own tokens alone: the causal ``q k^T * D``, the
unit-lower-triangular ``(I + A)``, ``A_ij = beta_i (k_i . k_j) D_ij`` (``j < i``), inverted by 16-row blocks
(:func:`~laquant.kernels.common.triton_numerics.unit_lower_inverse`), and the WY form's
``u = (I + A)^-1 (beta v)`` and ``w = (I + A)^-1 (beta exp(G) k)``. One program per (chunk, sequence, head),
all chunks in parallel; it writes each token's row of the three, in the layout of KDA's
:func:`~laquant.kernels.kda.chunk.kda_intra_chunk` (whose per-channel decays need sub-blocks), so the delta
rule's walk (:mod:`laquant.kernels.delta.chunk`) reads either. This is fla's ``chunk_scaled_dot_kkt`` /
``solve_tril`` / ``recompute_w_u`` split: it lets one long sequence walk in 64-token steps, a quarter of the
serial steps, with the walk left only the products against the state. Spec:
:func:`~laquant.kernels.kda.reference.intra_chunk_rows` with the decay broadcast over the channels.
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.sizes import cdiv, next_power_of_2

try:
    import triton
    import triton.language as tl

    from ..common.triton_numerics import intra_chunk_tile, mm, unit_lower_inverse
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


if triton is not None:

    @triton.jit
    def _delta_intra_chunk_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, qk_ptr, w_ptr, u_ptr, cu_ptr, slot_ptr,
                                  s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh,
                                  s_bb, s_bt, s_bh, T, qk_scale,
                                  H: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr,
                                  LOW_PRECISION: tl.constexpr, L2NORM: tl.constexpr):
        """One chunk of one (sequence, value head); the grid as :func:`intra_grid` makes it."""
        h, eos, b, rows, offs_k, offs_v, mk, mv, t0, offs_t, mt, mtk = intra_chunk_tile(
            cu_ptr, slot_ptr, T, H, K, V, BT, BK, BV, VARLEN)
        if t0 < eos:
            hk = h // GROUP
            mtv = mt[:, None] & mv[None, :]
            q = tl.load(q_ptr + b * s_qb + hk * s_qh + offs_t[:, None] * s_qt + offs_k[None, :], mask=mtk,
                        other=0.0).to(tl.float32)
            k = tl.load(k_ptr + b * s_kb + hk * s_kh + offs_t[:, None] * s_kt + offs_k[None, :], mask=mtk,
                        other=0.0).to(tl.float32)
            v = tl.load(v_ptr + b * s_vb + h * s_vh + offs_t[:, None] * s_vt + offs_v[None, :], mask=mtv,
                        other=0.0).to(tl.float32)
            beta = tl.load(beta_ptr + b * s_bb + h * s_bh + offs_t * s_bt, mask=mt, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + b * s_gb + h * s_gh + offs_t * s_gt, mask=mt, other=0.0).to(tl.float32)
            if L2NORM:  # as the walk: x * rsqrt(sum(x^2) + 1e-6); padded rows stay 0
                q = q * tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None]
                k = k * tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
            q = q * qk_scale
            G = tl.cumsum(g, axis=0)
            causal = rows[:, None] >= rows[None, :]
            D = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))
            A = tl.where(rows[:, None] > rows[None, :], mm(k, tl.trans(k), LOW_PRECISION) * D * beta[:, None], 0.0)
            QK = tl.where(causal, mm(q, tl.trans(k), LOW_PRECISION) * D, 0.0)
            inv = unit_lower_inverse(A, rows, BT, LOW_PRECISION)
            u = mm(inv, v * beta[:, None], LOW_PRECISION)
            w = mm(inv, k * (beta * tl.exp(G))[:, None], LOW_PRECISION)
            tok = (b * T + offs_t).to(tl.int64) * H + h
            tl.store(qk_ptr + tok[:, None] * BT + rows[None, :], QK.to(qk_ptr.dtype.element_ty), mask=mt[:, None])
            tl.store(w_ptr + tok[:, None] * K + offs_k[None, :], w.to(w_ptr.dtype.element_ty), mask=mtk)
            tl.store(u_ptr + tok[:, None] * V + offs_v[None, :], u.to(u_ptr.dtype.element_ty), mask=mtv)


def intra_outputs(q, v, block_t: int):
    """Empty ``(qk [B, T, Hv, block_t], w [B, T, Hv, K], u [B, T, Hv, V])`` for an intra-chunk kernel, in the
    inputs' dtype (float32 for float32 inputs, else bf16: the walk rounds them to that for its products)."""
    B, T, _, K = q.shape
    H, V = v.shape[2], v.shape[3]
    dtype = torch.float32 if q.dtype == torch.float32 else torch.bfloat16
    return (torch.empty(B, T, H, block_t, dtype=dtype, device=q.device),
            torch.empty(B, T, H, K, dtype=dtype, device=q.device),
            torch.empty(B, T, H, V, dtype=dtype, device=q.device))


def intra_grid(B: int, T: int, H: int, block_t: int, cu_seqlens: torch.Tensor | None, like: torch.Tensor):
    """``(grid, slot_map)`` of an intra-chunk kernel: ``(chunks, B * H)``, or with ``cu_seqlens`` one slot
    per chunk of the packed sequences (each slot's sequence and chunk, mapped on the device: no host sync;
    ``N`` spare slots cover the sequences' partial chunks) by ``H``. ``like`` stands in for an absent map."""
    chunks = cdiv(T, block_t)
    if cu_seqlens is None:
        return (chunks, B * H), like
    N = cu_seqlens.numel() - 1
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    ends = torch.cumsum((lengths + block_t - 1) // block_t, 0)
    slots = torch.arange(chunks + N, device=like.device)
    seq = torch.searchsorted(ends, slots, right=True).clamp_(max=N - 1)
    first = ends[seq] - (lengths[seq] + block_t - 1) // block_t
    return (chunks + N, H), torch.stack((seq, slots - first), 1).to(torch.int32).contiguous()


# Warps of the intra-chunk kernel by chunk size (not swept)
INTRA_WARPS = {16: 2, 32: 4, 64: 4}


def chunk_warps(block_t: int, K: int, low_precision: bool, warps: int, wy_in_walk: bool = False,
                per_channel: bool = False) -> int:
    """``warps`` for a delta-rule chunk kernel, except 2 for 64-token chunks at K <= 32 in bf16, or in any dtype with
    a per-channel decay (``per_channel``: KDA), and for bf16 ones that build their WY form in the walk
    (``wy_in_walk``). At 4 warps those faulted with an illegal address or gave wrong outputs on an H200 (Triton 3.6):
    in bf16 the intra-chunk kernel at K = 16 and 32 (K = 64 and 128 ran right) and the one-launch walk at K = 48 and
    128 (eval/results/split_intra_h200/); in float32 KDA's prefill at K = 16 (off by up to 3e-2; K = 32 ran right),
    while the delta rule's float32 prefill at K = 16 ran right at 4 warps (eval/results/graphed_forward_h200/,
    tools/probe_chunk64.py). Every one ran right at 2 warps."""
    small = block_t == 64 and (((low_precision or per_channel) and next_power_of_2(K) <= 32)
                               or (low_precision and wy_in_walk))
    return 2 if small else warps


def delta_intra_chunk(q, k, v, g, beta, scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
                      use_qk_l2norm: bool = False, block_t: int = 64):
    """The chunk-local half of the gated delta rule's chunked prefill (see the module's docstring) for every
    chunk of ``block_t`` tokens at once: ``(qk, w, u)`` as :func:`intra_outputs`, each token's row. Arguments
    as :func:`~laquant.kernels.delta.chunk.chunk_delta_triton` (shapes checked there)."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use laquant.kernels.kda.reference.intra_chunk_rows")
    B, T, Hk, K = q.shape
    H, V = v.shape[2], v.shape[3]
    qk, w, u = intra_outputs(q, v, block_t)
    if T == 0:
        return qk, w, u
    grid, slot_map = intra_grid(B, T, H, block_t, cu_seqlens, qk)
    launch_kernel(_delta_intra_chunk_kernel, grid,
        q, k, v, g, beta, qk, w, u, cu_seqlens if cu_seqlens is not None else qk, slot_map,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1), g.stride(2),
        beta.stride(0), beta.stride(1), beta.stride(2), T, K ** -0.5 if scale is None else scale,
        H=H, GROUP=H // Hk, K=K, V=V, BT=block_t, BK=next_power_of_2(K), BV=next_power_of_2(V),
        VARLEN=cu_seqlens is not None, LOW_PRECISION=q.dtype != torch.float32, L2NORM=use_qk_l2norm,
        num_warps=chunk_warps(block_t, K, q.dtype != torch.float32, INTRA_WARPS[block_t]))
    return qk, w, u
