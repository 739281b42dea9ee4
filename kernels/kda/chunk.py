"""Triton kernels: chunked Kimi Delta Attention (KDA) prefill with the state in a format.

The gated delta rule's chunk recurrence (:mod:`laquant.kernels.delta.chunk`) with a log-decay per key
channel, in two launches:

1. :func:`kda_intra_chunk`, one program per (chunk, sequence, head), all chunks at once: with
   ``G [BT, K]`` the chunk's cumulative log-decay, the unit-lower-triangular system
   ``A_ij = beta_i sum_c k_ic k_jc exp(G_ic - G_jc)`` and the causal ``q k^T`` with the same decay
   (pairwise inside sub-blocks of 8-16 rows, through each sub-block's first row as tensor-core products
   below them: every exponent <= 0, so strong decays cannot overflow); ``(I + A)`` inverted by forward
   substitution; the WY form's ``u = (I + A)^-1 (beta v)``
   and ``w = (I + A)^-1 (beta exp(G) k)``. It writes each token's row of ``q k^T * D``, ``w`` and ``u``
   (in the inputs' dtype: the next launch rounds them to it for its bf16 products anyway; 640 bytes a token
   and head in bf16 at Kimi's head size, so a prompt whose outputs would pass :data:`INTRA_BUDGET_BYTES` runs
   in pieces, the state carried between them in float32).
2. the delta rule's chunk kernel, one program per (sequence, value head, V block) walking the chunks
   with the ``[K, V]`` state in float32 registers: ``v_new = u - w S``,
   ``o = (q exp(G)) S + (q k^T * D) v_new``, ``S = Diag(exp(G_last)) S + (k exp(G_last - G))^T v_new``.

Built in the walk, as the first version did, the column loop ran serially chunk after chunk, 0.06-0.28x
fla's ``chunk_kda`` (``eval/results/speed_kda_h100.md``); the intra-chunk launch then built every pair's
``[BT, BT, 8]`` channel slices on the CUDA cores, 14-17 ms of a 64 x 1,024-token prefill
(``eval/results/kimi_h200/``). State formats in, inside (every 64 tokens with
``roundtrip``) and out, ``cu_seqlens``, grouped heads and the in-kernel q/k l2norm are the delta
kernel's. Spec: :func:`chunk_kda_reference` (:func:`~laquant.kernels.kda.reference.chunk_kda` per
sequence).
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.sizes import next_power_of_2
from ..common.state import State, StateQuantizer
from ..delta.chunk import launch_with_intra, per_sequence_reference, triton
from ..delta.intra import chunk_warps, intra_grid, intra_outputs
from .reference import chunk_kda

if triton is not None:
    import triton.language as tl

    from ..common.triton_numerics import dot_f32, intra_chunk_tile, mm, tile_row, unit_lower_inverse

    @triton.jit
    def _kda_intra_chunk_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, qk_ptr, w_ptr, u_ptr, cu_ptr, slot_ptr,
                                s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_gk,
                                s_bb, s_bt, s_bh, T, qk_scale,
                                H: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                BT: tl.constexpr, BK: tl.constexpr, SB: tl.constexpr, BV: tl.constexpr,
                                VARLEN: tl.constexpr, LOW_PRECISION: tl.constexpr, L2NORM: tl.constexpr):
        """One chunk of one (sequence, value head): its rows of ``q k^T * D`` (causal), ``w`` and ``u``.
        Grid: (chunk slots, heads) with ``VARLEN`` (``slot_ptr``: each slot's sequence and chunk, a slot
        past its sequence's end does nothing), else (chunks, sequences * heads).

        The decayed products ``sum_c x_ic k_jc exp(G_ic - G_jc)`` (x = k for A, q for q k^T) in the chunk's
        sub-blocks of ``SB`` rows: inside a sub-block, pair by pair along the diagonals ``j = i - d``, with
        ``G_i - G_j`` the sum of the ``d`` log-decays between them (shifted loads of g and k); below it, as
        matrix products through the sub-block's first row ``r``: ``(x_i exp(G_i - G_r)) . (k_j exp(G_r - G_j))``
        for ``j < r <= i``. Every exponent is <= 0, so strong decays cannot overflow."""
        h, eos, b, rows, offs_k, offs_v, mk, mv, t0, offs_t, mt, mtk = intra_chunk_tile(
            cu_ptr, slot_ptr, T, H, K, V, BT, BK, BV, VARLEN)
        if t0 < eos:
            hk = h // GROUP
            k_rows = k_ptr + b * s_kb + hk * s_kh + offs_k[None, :]
            g_rows = g_ptr + b * s_gb + h * s_gh + offs_k[None, :] * s_gk
            q = tl.load(q_ptr + b * s_qb + hk * s_qh + offs_t[:, None] * s_qt + offs_k[None, :], mask=mtk,
                        other=0.0).to(tl.float32)
            k = tl.load(k_rows + offs_t[:, None] * s_kt, mask=mtk, other=0.0).to(tl.float32)
            g = tl.load(g_rows + offs_t[:, None] * s_gt, mask=mtk, other=0.0).to(tl.float32)
            beta = tl.load(beta_ptr + b * s_bb + h * s_bh + offs_t * s_bt, mask=mt, other=0.0).to(tl.float32)
            # each row's factor (the l2norm's, and the scale for q), applied to the products' rows and columns
            # at the end: a shifted row of k then needs no norm of its own
            q_row = tl.full([BT], qk_scale, tl.float32)
            k_row = tl.full([BT], 1.0, tl.float32)
            if L2NORM:  # as the chunk kernel: x * rsqrt(sum(x^2) + 1e-6)
                q_row = q_row * tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)
                k_row = tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)
            G = tl.cumsum(g, axis=0)
            pos = rows % SB
            diag = rows[:, None] == rows[None, :]
            QK = tl.where(diag, tl.sum(q * k, axis=1)[:, None], 0.0)
            A = tl.zeros([BT, BT], dtype=tl.float32)
            gap = g  # sum of the log-decays of rows i-d+1 .. i: G_i - G_(i-d)
            to_first = tl.zeros([BT, BK], dtype=tl.float32) + 1.0  # exp(G_i - G_r), r the first row of i's sub-block
            for d in tl.static_range(1, SB):
                pair = (pos >= d) & mt
                if d > 1:
                    gap += tl.load(g_rows + (offs_t - d + 1)[:, None] * s_gt, mask=pair[:, None] & mk[None, :],
                                   other=0.0).to(tl.float32)
                kj = tl.load(k_rows + (offs_t - d)[:, None] * s_kt, mask=pair[:, None] & mk[None, :],
                             other=0.0).to(tl.float32)
                decay = tl.exp(gap)
                kd = kj * decay
                at = (rows[:, None] - d == rows[None, :]) & pair[:, None]
                A = tl.where(at, tl.sum(k * kd, axis=1)[:, None], A)
                QK = tl.where(at, tl.sum(q * kd, axis=1)[:, None], QK)
                to_first = tl.where((pos == d)[:, None], decay, to_first)
            k_first = k * to_first
            q_first = q * to_first
            for s in tl.static_range(1, BT // SB):
                r = s * SB
                G_r = tile_row(G, rows, r)
                from_r = k * tl.exp(tl.where((rows < r)[:, None], G_r[None, :] - G, float("-inf")))  # 0 for j >= r
                block = (rows // SB == s)[:, None]
                A = tl.where(block, A + dot_f32(k_first, tl.trans(from_r), LOW_PRECISION), A)
                QK = tl.where(block, QK + dot_f32(q_first, tl.trans(from_r), LOW_PRECISION), QK)
            A = tl.where(rows[:, None] > rows[None, :], A * (beta * k_row)[:, None] * k_row[None, :], 0.0)
            QK = QK * q_row[:, None] * k_row[None, :]
            inv = unit_lower_inverse(A, rows, BT, LOW_PRECISION)
            mtv = mt[:, None] & mv[None, :]
            v = tl.load(v_ptr + b * s_vb + h * s_vh + offs_t[:, None] * s_vt + offs_v[None, :], mask=mtv,
                        other=0.0).to(tl.float32)
            u = mm(inv, v * beta[:, None], LOW_PRECISION)
            w = mm(inv, k * (beta * k_row)[:, None] * tl.exp(G), LOW_PRECISION)
            tok = (b * T + offs_t).to(tl.int64) * H + h
            tl.store(qk_ptr + tok[:, None] * BT + rows[None, :], QK.to(qk_ptr.dtype.element_ty), mask=mt[:, None])
            tl.store(w_ptr + tok[:, None] * K + offs_k[None, :], w.to(w_ptr.dtype.element_ty), mask=mtk)
            tl.store(u_ptr + tok[:, None] * V + offs_v[None, :], u.to(u_ptr.dtype.element_ty), mask=mtv)


# the chunk sizes chunk_kda_triton runs (64 measured several times slower than 16: intra_sub_block)
BLOCK_TS = (16, 32, 64)


def intra_sub_block(block_t: int) -> int:
    """Rows of the intra-chunk kernel's sub-blocks: pairs inside one cost an exponential tile per diagonal,
    each sub-block below the first a row extraction, an exponential tile and two matrix products (64 x 1,024
    tokens, chunk 16, H200: 5.6 ms at 8 rows, 8.0 at 16 (no products), 8.8 at 4, 23 at 2;
    ``tools/sweep_kda_intra.py``). Chunks of 32 and 64, several times slower at every sub-block size timed
    (2-8 rows), take 16 rows, not timed."""
    return 8 if block_t <= 16 else 16


def kda_intra_chunk(q, k, v, g, beta, scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
                    use_qk_l2norm: bool = False, block_t: int = 16, sub_block: int | None = None):
    """The chunk-local half of KDA's chunked prefill (see the module's docstring), for every chunk of
    ``block_t`` tokens at once: ``(qk [B, T, Hv, block_t], w [B, T, Hv, K], u [B, T, Hv, V])``, each
    token's row, in the inputs' dtype (float32 for float32 inputs). Arguments as :func:`chunk_kda_triton`;
    ``sub_block`` (a power of two from 2 to ``block_t``) as :func:`intra_sub_block` by default."""
    B, T, Hk, K = q.shape
    H, V = v.shape[2], v.shape[3]
    sub_block = intra_sub_block(block_t) if sub_block is None else sub_block
    if sub_block < 2 or sub_block > block_t or sub_block & (sub_block - 1):
        raise ValueError(f"sub_block must be a power of two from 2 to block_t ({block_t}); got {sub_block}")
    qk, w, u = intra_outputs(q, v, block_t)
    if T == 0:
        return qk, w, u
    grid, slot_map = intra_grid(B, T, H, block_t, cu_seqlens, qk)
    BK, BV = next_power_of_2(K), next_power_of_2(V)
    launch_kernel(_kda_intra_chunk_kernel, grid,
        q, k, v, g, beta, qk, w, u, cu_seqlens if cu_seqlens is not None else qk, slot_map,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1), g.stride(2), g.stride(3),
        beta.stride(0), beta.stride(1), beta.stride(2), T, K ** -0.5 if scale is None else scale,
        H=H, GROUP=H // Hk, K=K, V=V, BT=block_t, BK=BK, SB=sub_block, BV=BV,
        VARLEN=cu_seqlens is not None, LOW_PRECISION=q.dtype != torch.float32, L2NORM=use_qk_l2norm,
        num_warps=chunk_warps(block_t, K, q.dtype != torch.float32, 2 if block_t <= 16 else 4,  # sweep_kda_intra.py
                              per_channel=True))
    return qk, w, u


def chunk_kda_reference(q, k, v, g, beta, scale=None, initial_state: State | None = None,
                        output_final_state: bool = False, final_format: str = "fp32",
                        roundtrip: StateQuantizer | None = None, cu_seqlens: torch.Tensor | None = None,
                        use_qk_l2norm: bool = False, rounding: str = "nearest", seed: int = 0,
                        position: int | None = None):
    """What :func:`chunk_kda_triton` computes, in PyTorch; same arguments and returns."""
    return per_sequence_reference(chunk_kda, q, k, v, g, beta, scale, initial_state, output_final_state, final_format,
                                  roundtrip, cu_seqlens, use_qk_l2norm, rounding, seed, position)


def chunk_kda_triton(q, k, v, g, beta, scale: float | None = None, initial_state: State | None = None,
                     output_final_state: bool = False, final_format: str = "fp32",
                     roundtrip: StateQuantizer | None = None, cu_seqlens: torch.Tensor | None = None,
                     use_qk_l2norm: bool = False, block_t: int = 16, block_v: int | None = None,
                     num_warps: int | None = None, num_stages: int | None = None, out: torch.Tensor | None = None,
                     rounding: str = "nearest", seed: int = 0, position: int | None = None):
    """Chunked KDA forward. q, k ``[B, T, Hk, K]``, v ``[B, T, Hv, V]`` (``Hv`` a multiple of
    ``Hk``), g (log-decay) ``[B, T, Hv, K]``, beta ``[B, T, Hv]``; ``cu_seqlens``, the state
    arguments, the launch parameters and the stochastic rounding's as
    :func:`~laquant.kernels.delta.chunk.chunk_delta_triton`.
    Returns ``(o, final_state or None)``."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use chunk_kda_reference")
    if block_t not in BLOCK_TS:
        raise ValueError(f"KDA's chunked prefill takes chunks of 16, 32 or 64 tokens; got block_t={block_t}")
    B, T, Hk, K = q.shape
    H = v.shape[2]
    if (k.shape != q.shape or v.shape[:2] != q.shape[:2] or H % Hk or g.shape != (*v.shape[:3], K)
            or beta.shape != v.shape[:3]):
        raise ValueError(f"expected q, k [B, T, Hk, K], v [B, T, Hv, V] with Hv a multiple of Hk, g [B, T, Hv, K] "
                         f"and beta [B, T, Hv]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    return launch_with_intra(kda_intra_chunk, q, k, v, g, beta, scale, initial_state, output_final_state,
                             final_format, roundtrip, cu_seqlens, use_qk_l2norm, block_t, block_v, num_warps,
                             num_stages, out, rounding, seed, position)
