"""Triton kernel: chunked gated-delta-rule prefill (Gated DeltaNet, Qwen3-Next) with the state in a format.

One program owns one (sequence, value head, V block) and walks its sequence in chunks of ``BT``
(16, 32 or 64) tokens with the ``[K, V]`` state in float32 registers, as the GLA prefill
(:mod:`laquant.kernels.gla_chunk_triton`) does. Per chunk, with ``G`` the cumulative log-decay
inside it (a scalar per head and token) and ``D_ij = exp(G_i - G_j)`` for ``j <= i``:

* the delta updates inside the chunk are one unit-lower-triangular system
  ``(I + A)``, ``A_ij = beta_i (k_i . k_j) D_ij`` for ``j < i``. Its inverse is built row by row
  (forward substitution on the ``[BT, BT]`` tile in registers), then
  ``u = (I + A)^-1 (beta v)`` and ``w = (I + A)^-1 (beta exp(G) k)`` (the WY form);
* ``v_new = u - w S`` are the values actually written; ``o = (q exp(G)) S + (q k^T * D) v_new``;
* ``S = exp(G_last) S + (k exp(G_last - G))^T v_new``, passed through its storage format every 64
  tokens when a ``roundtrip`` is given (as the reference does), and written out at the end.

The inverse and ``w`` depend only on k, g and beta, so with V split over several programs each
recomputes them: cheap next to the ``[BT, K] x [K, BV]`` products. The spec is
:func:`chunk_delta_reference` (laquant's :func:`~laquant.kernels.chunk_gated_delta_rule` per
sequence, with the formats of :class:`~laquant.quant.state.StateQuantizer`). Matmuls take bf16
operands with float32 accumulation for bf16 inputs (as fla does), exact float32 for float32 inputs;
the triangular solve is always float32.
"""

from __future__ import annotations

import torch

from laquant.kernels.delta_reference import chunk_gated_delta_rule
from laquant.kernels.gla_chunk_triton import CHUNK, PrefillStates, alloc_states, sequence_bounds, store_states
from laquant.kernels.triton_numerics import format_code
from laquant.quant.state import StateFormat, StateQuantizer

try:
    import triton
    import triton.language as tl

    from laquant.kernels.triton_numerics import (absmax_row_scale, decode_state, encode_state, mm, roundtrip_state,
                                                 tile_row)
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def chunk_delta_reference(q, k, v, g, beta, scale=None, initial_state: PrefillStates | None = None,
                          output_final_state: bool = False, final_format: str = "fp32",
                          roundtrip: StateQuantizer | None = None, cu_seqlens: torch.Tensor | None = None,
                          use_qk_l2norm: bool = False):
    """What :func:`chunk_delta_triton` computes, in PyTorch; same arguments and returns."""
    rt = roundtrip.roundtrip if roundtrip is not None and roundtrip.format.name != "fp32" else None
    h0 = initial_state.load() if initial_state is not None else None
    outs, finals = [], []
    for n, (bos, eos) in enumerate(sequence_bounds(q, cu_seqlens)):
        b = 0 if cu_seqlens is not None else n
        seg = lambda x: x[b:b + 1, bos:eos]  # noqa: E731
        o, state = chunk_gated_delta_rule(seg(q), seg(k), seg(v), seg(g), seg(beta), scale,
                                          initial_state=h0[n:n + 1] if h0 is not None else None,
                                          output_final_state=True, use_qk_l2norm=use_qk_l2norm, chunk_size=CHUNK,
                                          state_roundtrip=rt)
        outs.append(o)
        finals.append(state)
    o = torch.cat(outs, 1) if cu_seqlens is not None else torch.cat(outs, 0)
    return o, (store_states(torch.cat(finals), final_format) if output_final_state else None)


if triton is not None:

    @triton.jit
    def _chunk_delta_fwd_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, h0s_ptr, ht_ptr, hts_ptr, static_ptr, cu_ptr,
        s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
        s_ob, s_ot, s_oh,
        T, qk_scale,
        H: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
        BK: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr, HAS_H0: tl.constexpr, IN_FMT: tl.constexpr,
        STORE_HT: tl.constexpr, OUT_FMT: tl.constexpr, QMAX_OUT: tl.constexpr, RT_FMT: tl.constexpr,
        RT_EVERY: tl.constexpr, RT_STATIC: tl.constexpr, QMAX_RT: tl.constexpr, LOW_PRECISION: tl.constexpr,
        L2NORM: tl.constexpr,
    ):
        i_nh = tl.program_id(0)
        i_v = tl.program_id(1)
        n = i_nh // H
        h = i_nh % H
        hk = h // GROUP
        if VARLEN:
            bos = tl.load(cu_ptr + n).to(tl.int64)
            eos = tl.load(cu_ptr + n + 1).to(tl.int64)
            b = 0
        else:
            bos = 0
            eos = T
            b = n
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mk = offs_k < K
        mv = offs_v < V
        mkv = mk[:, None] & mv[None, :]
        rows = tl.arange(0, BT)
        causal = rows[:, None] >= rows[None, :]
        q_base = q_ptr + b * s_qb + hk * s_qh
        k_base = k_ptr + b * s_kb + hk * s_kh
        v_base = v_ptr + b * s_vb + h * s_vh
        o_base = o_ptr + b * s_ob + h * s_oh
        state_off = (n * H + h).to(tl.int64) * K * V + offs_k[:, None] * V + offs_v[None, :]
        scale_off = (n * H + h).to(tl.int64) * K + offs_k

        S = tl.zeros([BK, BV], dtype=tl.float32)
        if HAS_H0:
            h0_scale = tl.full([BK], 1.0, tl.float32)
            if IN_FMT >= 2:
                h0_scale = tl.load(h0s_ptr + scale_off, mask=mk, other=1.0)
            S = decode_state(tl.load(h0_ptr + state_off, mask=mkv, other=0.0), h0_scale, IN_FMT)
        static = tl.full([BK], 1.0, tl.float32)
        if RT_STATIC:
            static = tl.load(static_ptr + h * K + offs_k, mask=mk, other=1.0)

        n_chunks = tl.cdiv(eos - bos, BT)
        for i_c in range(0, n_chunks):
            t0 = bos + i_c * BT
            offs_t = t0 + rows
            mt = offs_t < eos
            mtk = mt[:, None] & mk[None, :]
            mtv = mt[:, None] & mv[None, :]
            q = tl.load(q_base + offs_t[:, None] * s_qt + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
            k = tl.load(k_base + offs_t[:, None] * s_kt + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
            v = tl.load(v_base + offs_t[:, None] * s_vt + offs_v[None, :], mask=mtv, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + b * s_gb + h * s_gh + offs_t * s_gt, mask=mt, other=0.0).to(tl.float32)
            beta = tl.load(beta_ptr + b * s_bb + h * s_bh + offs_t * s_bt, mask=mt, other=0.0).to(tl.float32)
            if L2NORM:  # as fla and transformers: x * rsqrt(sum(x^2) + 1e-6); padded rows stay 0
                q = q * tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None]
                k = k * tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
            q = q * qk_scale
            G = tl.cumsum(g, axis=0)
            D = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))
            A = tl.where(rows[:, None] > rows[None, :], mm(k, tl.trans(k), LOW_PRECISION) * D * beta[:, None], 0.0)
            # (I + A)^-1 = I + L, L strictly lower: row i of L is -a_i - a_i L (a_i row i of A)
            L = tl.zeros([BT, BT], dtype=tl.float32)
            for i in tl.static_range(1, BT):
                a_i = tile_row(A, rows, i)
                l_i = -a_i - tl.sum(a_i[:, None] * L, axis=0)
                L = tl.where((rows == i)[:, None], l_i[None, :], L)
            inv = L + tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
            u = mm(inv, v * beta[:, None], LOW_PRECISION)
            w = mm(inv, k * (beta * tl.exp(G))[:, None], LOW_PRECISION)
            v_new = u - mm(w, S, LOW_PRECISION)
            o = mm(q * tl.exp(G)[:, None], S, LOW_PRECISION)
            o += mm(tl.where(causal, mm(q, tl.trans(k), LOW_PRECISION) * D, 0.0), v_new, LOW_PRECISION)
            tl.store(o_base + offs_t[:, None] * s_ot + offs_v[None, :], o.to(o_ptr.dtype.element_ty), mask=mtv)
            G_last = tl.sum(tl.where(rows == BT - 1, G, 0.0), axis=0)  # padded rows have g = 0
            S = S * tl.exp(G_last) + mm(tl.trans(k * tl.exp(G_last - G)[:, None]), v_new, LOW_PRECISION)
            if RT_FMT > 0:
                if ((i_c + 1) % RT_EVERY == 0) & (t0 + BT < eos):
                    if RT_STATIC:
                        S = roundtrip_state(S, static, RT_FMT)
                    else:
                        S = roundtrip_state(S, absmax_row_scale(S, QMAX_RT), RT_FMT)
        if STORE_HT:
            out_scale = absmax_row_scale(S, QMAX_OUT)
            tl.store(ht_ptr + state_off, encode_state(S, out_scale, OUT_FMT), mask=mkv)
            if OUT_FMT >= 2:
                tl.store(hts_ptr + scale_off, out_scale, mask=mk)


if triton is not None:

    @triton.jit
    def _unit_lower_inverse(A, rows, BT: tl.constexpr):
        """``(I + A)^-1`` of a strictly lower ``[BT, BT]`` tile, by forward substitution:
        ``(I + A)^-1 = I + L`` with row i of L ``-a_i - a_i L`` (``a_i`` row i of A)."""
        L = tl.zeros([BT, BT], dtype=tl.float32)
        for i in tl.static_range(1, BT):
            a_i = tile_row(A, rows, i)
            L = tl.where((rows == i)[:, None], (-a_i - tl.sum(a_i[:, None] * L, axis=0))[None, :], L)
        return L + tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)

    @triton.jit
    def _load_sub(base, stride_t, offs_t, eos, offs_d, D: tl.constexpr, L2NORM: tl.constexpr):
        m = offs_t < eos
        x = tl.load(base + offs_t[:, None] * stride_t + offs_d[None, :], mask=m[:, None] & (offs_d < D)[None, :],
                    other=0.0).to(tl.float32)
        if L2NORM:
            x = x * tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
        return x

    @triton.jit
    def _system_block(ki, kj, beta_i, Gi, Gj, rows, DIAG: tl.constexpr, LOW_PRECISION: tl.constexpr):
        """Block (i, j) of the chunk's system: ``beta_i (k_i . k_j) exp(G_i - G_j)``, strictly lower
        on the diagonal."""
        if DIAG:
            below = rows[:, None] > rows[None, :]
            out = tl.where(below, mm(ki, tl.trans(kj), LOW_PRECISION) * beta_i[:, None]
                           * tl.exp(tl.where(below, Gi[:, None] - Gj[None, :], 0.0)), 0.0)
        else:
            out = mm(ki, tl.trans(kj), LOW_PRECISION) * beta_i[:, None] * tl.exp(Gi[:, None] - Gj[None, :])
        return out

    @triton.jit
    def _delta_wy_kernel(
        k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, cu_ptr,
        s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh,
        T,
        H: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
        BV: tl.constexpr, VARLEN: tl.constexpr, LOW_PRECISION: tl.constexpr, L2NORM: tl.constexpr,
    ):
        """Per 64-token chunk, in parallel: ``w = (I + A)^-1 (beta exp(G) k)`` and ``u = (I + A)^-1 (beta v)``.
        The inverse is built from four 16 x 16 diagonal blocks (forward substitution) merged
        blockwise: ``T_ij = -T_ii sum_{j <= m < i} A_im T_mj``."""
        i_nh = tl.program_id(0)
        i_c = tl.program_id(1)
        n = i_nh // H
        h = i_nh % H
        hk = h // GROUP
        if VARLEN:
            bos = tl.load(cu_ptr + n).to(tl.int64)
            eos = tl.load(cu_ptr + n + 1).to(tl.int64)
            b = 0
        else:
            bos = 0
            eos = T
            b = n
        t0 = bos + i_c * 64
        if t0 < eos:
            r = tl.arange(0, 16)
            offs_k = tl.arange(0, BK)
            offs_v = tl.arange(0, BV)
            k_base = k_ptr + b * s_kb + hk * s_kh
            v_base = v_ptr + b * s_vb + h * s_vh
            g_base = g_ptr + b * s_gb + h * s_gh
            be_base = beta_ptr + b * s_bb + h * s_bh
            t_0, t_1, t_2, t_3 = t0 + r, t0 + 16 + r, t0 + 32 + r, t0 + 48 + r
            k0 = _load_sub(k_base, s_kt, t_0, eos, offs_k, K, L2NORM)
            k1 = _load_sub(k_base, s_kt, t_1, eos, offs_k, K, L2NORM)
            k2 = _load_sub(k_base, s_kt, t_2, eos, offs_k, K, L2NORM)
            k3 = _load_sub(k_base, s_kt, t_3, eos, offs_k, K, L2NORM)
            b0 = tl.load(be_base + t_0 * s_bt, mask=t_0 < eos, other=0.0).to(tl.float32)
            b1 = tl.load(be_base + t_1 * s_bt, mask=t_1 < eos, other=0.0).to(tl.float32)
            b2 = tl.load(be_base + t_2 * s_bt, mask=t_2 < eos, other=0.0).to(tl.float32)
            b3 = tl.load(be_base + t_3 * s_bt, mask=t_3 < eos, other=0.0).to(tl.float32)
            G0 = tl.cumsum(tl.load(g_base + t_0 * s_gt, mask=t_0 < eos, other=0.0).to(tl.float32), axis=0)
            G1 = tl.cumsum(tl.load(g_base + t_1 * s_gt, mask=t_1 < eos, other=0.0).to(tl.float32), axis=0)
            G2 = tl.cumsum(tl.load(g_base + t_2 * s_gt, mask=t_2 < eos, other=0.0).to(tl.float32), axis=0)
            G3 = tl.cumsum(tl.load(g_base + t_3 * s_gt, mask=t_3 < eos, other=0.0).to(tl.float32), axis=0)
            G1 += tl.sum(tl.where(r == 15, G0, 0.0), axis=0)  # cumulative from the chunk's start
            G2 += tl.sum(tl.where(r == 15, G1, 0.0), axis=0)
            G3 += tl.sum(tl.where(r == 15, G2, 0.0), axis=0)
            T00 = _unit_lower_inverse(_system_block(k0, k0, b0, G0, G0, r, True, LOW_PRECISION), r, 16)
            T11 = _unit_lower_inverse(_system_block(k1, k1, b1, G1, G1, r, True, LOW_PRECISION), r, 16)
            T22 = _unit_lower_inverse(_system_block(k2, k2, b2, G2, G2, r, True, LOW_PRECISION), r, 16)
            T33 = _unit_lower_inverse(_system_block(k3, k3, b3, G3, G3, r, True, LOW_PRECISION), r, 16)
            A10 = _system_block(k1, k0, b1, G1, G0, r, False, LOW_PRECISION)
            A20 = _system_block(k2, k0, b2, G2, G0, r, False, LOW_PRECISION)
            A21 = _system_block(k2, k1, b2, G2, G1, r, False, LOW_PRECISION)
            A30 = _system_block(k3, k0, b3, G3, G0, r, False, LOW_PRECISION)
            A31 = _system_block(k3, k1, b3, G3, G1, r, False, LOW_PRECISION)
            A32 = _system_block(k3, k2, b3, G3, G2, r, False, LOW_PRECISION)
            T10 = -mm(T11, mm(A10, T00, False), False)
            T21 = -mm(T22, mm(A21, T11, False), False)
            T32 = -mm(T33, mm(A32, T22, False), False)
            T20 = -mm(T22, mm(A20, T00, False) + mm(A21, T10, False), False)
            T31 = -mm(T33, mm(A31, T11, False) + mm(A32, T21, False), False)
            T30 = -mm(T33, mm(A30, T00, False) + mm(A31, T10, False) + mm(A32, T20, False), False)
            # w = T (beta exp(G) k), row block by row block
            kb0 = k0 * (b0 * tl.exp(G0))[:, None]
            kb1 = k1 * (b1 * tl.exp(G1))[:, None]
            kb2 = k2 * (b2 * tl.exp(G2))[:, None]
            kb3 = k3 * (b3 * tl.exp(G3))[:, None]
            w_base = w_ptr + b * s_wb + h * s_wh + offs_k[None, :]
            mk = (offs_k < K)[None, :]
            tl.store(w_base + t_0[:, None] * s_wt, mm(T00, kb0, LOW_PRECISION).to(w_ptr.dtype.element_ty),
                     mask=(t_0 < eos)[:, None] & mk)
            tl.store(w_base + t_1[:, None] * s_wt,
                     (mm(T10, kb0, LOW_PRECISION) + mm(T11, kb1, LOW_PRECISION)).to(w_ptr.dtype.element_ty),
                     mask=(t_1 < eos)[:, None] & mk)
            tl.store(w_base + t_2[:, None] * s_wt,
                     (mm(T20, kb0, LOW_PRECISION) + mm(T21, kb1, LOW_PRECISION)
                      + mm(T22, kb2, LOW_PRECISION)).to(w_ptr.dtype.element_ty), mask=(t_2 < eos)[:, None] & mk)
            tl.store(w_base + t_3[:, None] * s_wt,
                     (mm(T30, kb0, LOW_PRECISION) + mm(T31, kb1, LOW_PRECISION) + mm(T32, kb2, LOW_PRECISION)
                      + mm(T33, kb3, LOW_PRECISION)).to(w_ptr.dtype.element_ty), mask=(t_3 < eos)[:, None] & mk)
            # u = T (beta v)
            vb0 = _load_sub(v_base, s_vt, t_0, eos, offs_v, V, False) * b0[:, None]
            vb1 = _load_sub(v_base, s_vt, t_1, eos, offs_v, V, False) * b1[:, None]
            vb2 = _load_sub(v_base, s_vt, t_2, eos, offs_v, V, False) * b2[:, None]
            vb3 = _load_sub(v_base, s_vt, t_3, eos, offs_v, V, False) * b3[:, None]
            u_base = u_ptr + b * s_ub + h * s_uh + offs_v[None, :]
            mv = (offs_v < V)[None, :]
            tl.store(u_base + t_0[:, None] * s_ut, mm(T00, vb0, LOW_PRECISION).to(u_ptr.dtype.element_ty),
                     mask=(t_0 < eos)[:, None] & mv)
            tl.store(u_base + t_1[:, None] * s_ut,
                     (mm(T10, vb0, LOW_PRECISION) + mm(T11, vb1, LOW_PRECISION)).to(u_ptr.dtype.element_ty),
                     mask=(t_1 < eos)[:, None] & mv)
            tl.store(u_base + t_2[:, None] * s_ut,
                     (mm(T20, vb0, LOW_PRECISION) + mm(T21, vb1, LOW_PRECISION)
                      + mm(T22, vb2, LOW_PRECISION)).to(u_ptr.dtype.element_ty), mask=(t_2 < eos)[:, None] & mv)
            tl.store(u_base + t_3[:, None] * s_ut,
                     (mm(T30, vb0, LOW_PRECISION) + mm(T31, vb1, LOW_PRECISION) + mm(T32, vb2, LOW_PRECISION)
                      + mm(T33, vb3, LOW_PRECISION)).to(u_ptr.dtype.element_ty), mask=(t_3 < eos)[:, None] & mv)

    @triton.jit
    def _delta_state_kernel(
        q_ptr, k_ptr, w_ptr, u_ptr, g_ptr, o_ptr, h0_ptr, h0s_ptr, ht_ptr, hts_ptr, static_ptr, cu_ptr,
        s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_gb, s_gt, s_gh,
        s_ob, s_ot, s_oh,
        T, qk_scale,
        H: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BK: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr, HAS_H0: tl.constexpr, IN_FMT: tl.constexpr,
        STORE_HT: tl.constexpr, OUT_FMT: tl.constexpr, QMAX_OUT: tl.constexpr, RT_FMT: tl.constexpr,
        RT_STATIC: tl.constexpr, QMAX_RT: tl.constexpr, LOW_PRECISION: tl.constexpr, L2NORM: tl.constexpr,
    ):
        """The sequential part, 64 tokens a step: ``v_new = u - w S``, the output, the state update
        and its round trip through the storage format."""
        BT: tl.constexpr = 64
        i_nh = tl.program_id(0)
        i_v = tl.program_id(1)
        n = i_nh // H
        h = i_nh % H
        hk = h // GROUP
        if VARLEN:
            bos = tl.load(cu_ptr + n).to(tl.int64)
            eos = tl.load(cu_ptr + n + 1).to(tl.int64)
            b = 0
        else:
            bos = 0
            eos = T
            b = n
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mk = offs_k < K
        mv = offs_v < V
        mkv = mk[:, None] & mv[None, :]
        rows = tl.arange(0, BT)
        causal = rows[:, None] >= rows[None, :]
        q_base = q_ptr + b * s_qb + hk * s_qh
        k_base = k_ptr + b * s_kb + hk * s_kh
        w_base = w_ptr + b * s_wb + h * s_wh
        u_base = u_ptr + b * s_ub + h * s_uh
        o_base = o_ptr + b * s_ob + h * s_oh
        state_off = (n * H + h).to(tl.int64) * K * V + offs_k[:, None] * V + offs_v[None, :]
        scale_off = (n * H + h).to(tl.int64) * K + offs_k

        S = tl.zeros([BK, BV], dtype=tl.float32)
        if HAS_H0:
            h0_scale = tl.full([BK], 1.0, tl.float32)
            if IN_FMT >= 2:
                h0_scale = tl.load(h0s_ptr + scale_off, mask=mk, other=1.0)
            S = decode_state(tl.load(h0_ptr + state_off, mask=mkv, other=0.0), h0_scale, IN_FMT)
        static = tl.full([BK], 1.0, tl.float32)
        if RT_STATIC:
            static = tl.load(static_ptr + h * K + offs_k, mask=mk, other=1.0)

        n_chunks = tl.cdiv(eos - bos, BT)
        for i_c in range(0, n_chunks):
            t0 = bos + i_c * BT
            offs_t = t0 + rows
            mt = offs_t < eos
            mtk = mt[:, None] & mk[None, :]
            mtv = mt[:, None] & mv[None, :]
            q = _load_sub(q_base, s_qt, offs_t, eos, offs_k, K, L2NORM) * qk_scale
            k = _load_sub(k_base, s_kt, offs_t, eos, offs_k, K, L2NORM)
            w = tl.load(w_base + offs_t[:, None] * s_wt + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
            u = tl.load(u_base + offs_t[:, None] * s_ut + offs_v[None, :], mask=mtv, other=0.0).to(tl.float32)
            G = tl.cumsum(tl.load(g_ptr + b * s_gb + h * s_gh + offs_t * s_gt, mask=mt, other=0.0).to(tl.float32),
                          axis=0)
            v_new = u - mm(w, S, LOW_PRECISION)
            o = mm(q * tl.exp(G)[:, None], S, LOW_PRECISION)
            D = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))
            o += mm(tl.where(causal, mm(q, tl.trans(k), LOW_PRECISION) * D, 0.0), v_new, LOW_PRECISION)
            tl.store(o_base + offs_t[:, None] * s_ot + offs_v[None, :], o.to(o_ptr.dtype.element_ty), mask=mtv)
            G_last = tl.sum(tl.where(rows == BT - 1, G, 0.0), axis=0)  # padded rows have g = 0
            S = S * tl.exp(G_last) + mm(tl.trans(k * tl.exp(G_last - G)[:, None]), v_new, LOW_PRECISION)
            if RT_FMT > 0:
                if t0 + BT < eos:
                    if RT_STATIC:
                        S = roundtrip_state(S, static, RT_FMT)
                    else:
                        S = roundtrip_state(S, absmax_row_scale(S, QMAX_RT), RT_FMT)
        if STORE_HT:
            out_scale = absmax_row_scale(S, QMAX_OUT)
            tl.store(ht_ptr + state_off, encode_state(S, out_scale, OUT_FMT), mask=mkv)
            if OUT_FMT >= 2:
                tl.store(hts_ptr + scale_off, out_scale, mask=mk)


def chunk_delta_triton(q, k, v, g, beta, scale: float | None = None, initial_state: PrefillStates | None = None,
                       output_final_state: bool = False, final_format: str = "fp32",
                       roundtrip: StateQuantizer | None = None, cu_seqlens: torch.Tensor | None = None,
                       use_qk_l2norm: bool = False, block_t: int = 16, block_v: int | None = None,
                       num_warps: int = 4, num_stages: int = 1, out: torch.Tensor | None = None,
                       method: str = "wy", wy_warps: int = 4):
    """Chunked gated-delta-rule forward. q, k ``[B, T, Hk, K]``, v ``[B, T, Hv, V]`` (``Hv`` a
    multiple of ``Hk``), g (log-decay) and beta ``[B, T, Hv]``. With ``cu_seqlens`` (int32
    ``[N + 1]``), B is 1 and the N sequences lie back to back along T, as in fla.

    ``initial_state``: :class:`PrefillStates` ``[N, Hv, K, V]`` in fp32, bf16, fp8_row or int8_row.
    ``roundtrip``: the state's storage format inside the prefill (a :class:`StateQuantizer`),
    applied every 64 tokens. ``final_format``: the final state's format (fresh per-row scales).
    ``use_qk_l2norm`` normalises q and k in the kernel (Qwen3-Next does). ``block_t`` (16, 32 or
    64), ``block_v``, ``num_warps`` and ``num_stages`` are launch parameters; they do not change
    the result beyond rounding. Returns ``(o, final_state or None)``.
    """
    if triton is None:
        raise RuntimeError("Triton is not installed; use chunk_delta_reference")
    B, T, Hk, K = q.shape
    H, V = v.shape[2], v.shape[3]
    if (k.shape != q.shape or v.shape[:2] != q.shape[:2] or H % Hk or g.shape != v.shape[:3]
            or beta.shape != v.shape[:3]):
        raise ValueError(f"expected q, k [B, T, Hk, K], v [B, T, Hv, V] with Hv a multiple of Hk, g and beta "
                         f"[B, T, Hv]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 (sequences packed along T); got B={B}")
    if block_t not in (16, 32, 64):
        raise ValueError(f"block_t must be 16, 32 or 64; got {block_t}")
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    o = torch.empty_like(v) if out is None else out
    format_code(final_format)  # an unsupported format is named before any work
    if initial_state is not None:
        if tuple(initial_state.data.shape) != (N, H, K, V):
            raise ValueError(f"initial_state must be [N, Hv, K, V] = {(N, H, K, V)}; "
                             f"got {tuple(initial_state.data.shape)}")
        format_code(initial_state.format)
    final = alloc_states((N, H, K, V), final_format, q.device) if output_final_state else None
    rt_code = format_code(roundtrip.format.name) if roundtrip is not None else 0
    rt_static = bool(roundtrip is not None and roundtrip.format.is_scaled and roundtrip.renorm_interval == 0)
    BK, BV = triton.next_power_of_2(K), triton.next_power_of_2(V)
    needs_rows = final_format in ("fp8_row", "int8_row") or (rt_code >= 2 and not rt_static)
    if block_v is not None and not needs_rows:  # per-row scales need whole rows in one program
        BV = min(BV, block_v)
    dummy = o
    h0 = h0s = dummy
    if initial_state is not None:
        h0 = initial_state.data.contiguous()
        h0s = initial_state.scale.contiguous() if initial_state.scale is not None else dummy
    static = roundtrip.static_scale.reshape(H, K).float().contiguous().to(q.device) if rt_static else dummy
    qmax = lambda fmt: StateFormat(fmt).qmax if StateFormat(fmt).is_scaled else 1.0  # noqa: E731
    if method == "wy":
        longest = T if cu_seqlens is None else int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item())
        w = torch.empty(*v.shape[:3], K, dtype=q.dtype, device=q.device)
        u = torch.empty(v.shape, dtype=q.dtype, device=q.device)
        _delta_wy_kernel[(N * H, triton.cdiv(longest, 64))](
            k, v, g, beta, w, u, cu_seqlens if cu_seqlens is not None else dummy,
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            g.stride(0), g.stride(1), g.stride(2), beta.stride(0), beta.stride(1), beta.stride(2),
            w.stride(0), w.stride(1), w.stride(2), u.stride(0), u.stride(1), u.stride(2), T,
            H=H, GROUP=H // Hk, K=K, V=V, BK=BK, BV=triton.next_power_of_2(V), VARLEN=cu_seqlens is not None,
            LOW_PRECISION=q.dtype != torch.float32, L2NORM=use_qk_l2norm, num_warps=wy_warps,
        )
        _delta_state_kernel[(N * H, triton.cdiv(V, BV))](
            q, k, w, u, g, o, h0, h0s,
            final.data if final is not None else dummy,
            final.scale if final is not None and final.scale is not None else dummy,
            static, cu_seqlens if cu_seqlens is not None else dummy,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            w.stride(0), w.stride(1), w.stride(2), u.stride(0), u.stride(1), u.stride(2),
            g.stride(0), g.stride(1), g.stride(2), o.stride(0), o.stride(1), o.stride(2),
            T, K ** -0.5 if scale is None else scale,
            H=H, GROUP=H // Hk, K=K, V=V, BK=BK, BV=BV, VARLEN=cu_seqlens is not None,
            HAS_H0=initial_state is not None,
            IN_FMT=format_code(initial_state.format) if initial_state is not None else 0,
            STORE_HT=final is not None, OUT_FMT=format_code(final_format), QMAX_OUT=qmax(final_format),
            RT_FMT=rt_code, RT_STATIC=rt_static, QMAX_RT=qmax(roundtrip.format.name) if roundtrip is not None else 1.0,
            LOW_PRECISION=q.dtype != torch.float32, L2NORM=use_qk_l2norm, num_warps=num_warps, num_stages=num_stages,
        )
        return o, final
    _chunk_delta_fwd_kernel[(N * H, triton.cdiv(V, BV))](
        q, k, v, g, beta, o, h0, h0s,
        final.data if final is not None else dummy,
        final.scale if final is not None and final.scale is not None else dummy,
        static, cu_seqlens if cu_seqlens is not None else dummy,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1), g.stride(2),
        beta.stride(0), beta.stride(1), beta.stride(2), o.stride(0), o.stride(1), o.stride(2),
        T, K ** -0.5 if scale is None else scale,
        H=H, GROUP=H // Hk, K=K, V=V, BT=block_t, BK=BK, BV=BV, VARLEN=cu_seqlens is not None,
        HAS_H0=initial_state is not None, IN_FMT=format_code(initial_state.format) if initial_state is not None else 0,
        STORE_HT=final is not None, OUT_FMT=format_code(final_format), QMAX_OUT=qmax(final_format), RT_FMT=rt_code,
        RT_EVERY=CHUNK // block_t, RT_STATIC=rt_static,
        QMAX_RT=qmax(roundtrip.format.name) if roundtrip is not None else 1.0,
        LOW_PRECISION=q.dtype != torch.float32, L2NORM=use_qk_l2norm, num_warps=num_warps, num_stages=num_stages,
    )
    return o, final
