"""Triton kernel: GLA's multi-token verify step on a state pool (speculative decoding), and its commit.

``T`` tokens per sequence (q, k, g ``[B, T, H, K]``, v ``[B, T, H, V]``) run from the pool slot
``state[pool_idx[b]]``: the state after each token is stored in the pool's format exactly as
``T`` calls of :func:`~laquant.kernels.gla.decode.gla_decode_step` would store it (same scale rule,
store count ``n_stores + 1 + t``, stochastic rounding bits) and loaded back for the next token,
but the pool is left as it was; ``kept`` (optional, ``[B, T, H, K, V]`` in the format) receives
each of those states. Accepting ``n[b]`` tokens then writes the state after the ``n[b]``-th into the
slot: :func:`~laquant.kernels.common.pool_steps.commit_kept` from ``kept``, or
:func:`gla_commit`, which runs the first ``n[b]`` tokens again (no side buffer). Either leaves the
pool bit-identical to ``n[b]`` decode steps. Spec: :func:`gla_verify_reference` /
:func:`gla_commit_reference`, loops of the decode step's reference.

One program per (sequence, head, V block) walks the K rows in blocks of ``BLOCK_K`` (GLA updates
each row on its own), each block held in registers across the ``T`` tokens: the state is read once
and written once per kept token (never without ``kept``), the outputs of all tokens summed in
registers over the blocks. The state bits do not depend on the blocking; the outputs sum in
another order than the decode kernel's, so they match it to float32 rounding, not bit for bit.
Scaled formats (per-row scales over the whole V row) take the whole V row per program when they store
after every token (``numerics="decode"``; :mod:`~laquant.kernels.common.pool_steps`). A verify step with
``numerics="prefill"`` runs its own kernel, the tokens as one chunk of the chunked prefill
(``_gla_verify_chunk_kernel``, V in blocks, the whole K a program).
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.pool_steps import (Kept, accepted_counts, check_tokens, chunk_launch, kept_args, launch_args,
                                 pool_steps_reference, verify_step)
from ..common.state import StateQuantizer
from .reference import recurrent_gla_step

try:
    import triton
    import triton.language as tl

    from ..common.triton_numerics import (chunk_decay_splits, decayed_scores, decayed_update, load_state_rows, mm,
                                          store_verified_state, token_row, token_tile, verify_chunk_program)
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def gla_verify_reference(q, k, v, g, state, scale, pool_idx, quantizer: StateQuantizer, n_stores=None,
                         qk_scale: float | None = None, seed: int = 0, kept: Kept | None = None,
                         numerics: str = "decode") -> torch.Tensor:
    """What :func:`gla_verify` computes, in PyTorch: ``o`` ``[B, T, H, V]``; the pool untouched."""
    step = lambda t, h: recurrent_gla_step(q[:, t], k[:, t], v[:, t], g[:, t], h, qk_scale)  # noqa: E731
    return torch.stack(pool_steps_reference(step, q.shape[1], state, scale, pool_idx, quantizer, n_stores, seed,
                                            kept, numerics=numerics), 1)


def gla_commit_reference(q, k, v, g, state, scale, pool_idx, quantizer: StateQuantizer, accepted, n_stores=None,
                         qk_scale: float | None = None, seed: int = 0) -> None:
    """What :func:`gla_commit` does, in PyTorch: slot ``pool_idx[b]`` gets the state after
    ``accepted[b]`` of the tokens, as that many decode steps would leave it."""
    n = accepted_counts(accepted, q.shape[0], q.shape[1], q.device)
    step = lambda t, h: recurrent_gla_step(q[:, t], k[:, t], v[:, t], g[:, t], h, qk_scale)  # noqa: E731
    pool_steps_reference(step, q.shape[1], state, scale, pool_idx, quantizer, n_stores, seed, accepted=n)


if triton is not None:

    @triton.jit
    def _gla_token(q_rows, k_rows, g_rows, v_row, s_qt, s_kt, s_gt, s_vt, t, mask_k, mask_v, T):
        return (token_row(q_rows, s_qt, t, mask_k, T), token_row(k_rows, s_kt, t, mask_k, T),
                token_row(g_rows, s_gt, t, mask_k, T), token_row(v_row, s_vt, t, mask_v, T))

    @triton.jit
    def _gla_verify_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, o_ptr, state_ptr, scale_ptr, idx_ptr, nstore_ptr, static_ptr,
        kept_ptr, kept_scale_ptr, steps_ptr,
        s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk, s_vb, s_vt, s_vh, s_vv, s_gb, s_gt, s_gh, s_gk,
        s_ob, s_ot, s_oh, s_sp, s_sh, s_sk, s_cp, s_ch, s_eb, s_et, s_eh, s_ek, s_fb, s_ft, s_fh,
        T, qk_scale, seed,
        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
        BLOCK_T: tl.constexpr, FMT: tl.constexpr, RENORM: tl.constexpr, QMAX: tl.constexpr, SR: tl.constexpr,
        KEEP: tl.constexpr, COMMIT: tl.constexpr, PREFETCH: tl.constexpr,
    ):
        pid = tl.program_id(0)
        b = pid // H
        h = pid % H
        slot = tl.load(idx_ptr + b).to(tl.int64)
        offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        rows_t = tl.arange(0, BLOCK_T)
        position = 0  # the first token's store count, as the decode step's
        if RENORM > 1 or SR:
            position = tl.load(nstore_ptr + slot) + 1
        steps = T
        if COMMIT:
            steps = tl.load(steps_ptr + b)
        out = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)  # o of every token, summed over the K blocks
        # K rows evolve independently in GLA: each block of rows runs all the tokens from registers
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            mask = mask_k[:, None] & mask_v[None, :]
            ptrs = state_ptr + slot * s_sp + h * s_sh + offs_k[:, None] * s_sk + offs_v[None, :]
            sc_ptrs = scale_ptr + slot * s_cp + h * s_ch + offs_k
            S, old_scale = load_state_rows(ptrs, sc_ptrs, mask_k, mask, FMT, BLOCK_K)
            q_rows = q_ptr + b * s_qb + h * s_qh + offs_k * s_qk
            k_rows = k_ptr + b * s_kb + h * s_kh + offs_k * s_kk
            g_rows = g_ptr + b * s_gb + h * s_gh + offs_k * s_gk
            v_row = v_ptr + b * s_vb + h * s_vh + offs_v * s_vv
            if PREFETCH:
                q_next, k_next, g_next, v_next = _gla_token(q_rows, k_rows, g_rows, v_row, s_qt, s_kt, s_gt, s_vt, 0,
                                                            mask_k, mask_v, T)
            for t in range(0, steps):
                if PREFETCH:  # token t + 1's inputs load behind token t's arithmetic
                    q, kk, g, v = q_next, k_next, g_next, v_next
                    q_next, k_next, g_next, v_next = _gla_token(q_rows, k_rows, g_rows, v_row, s_qt, s_kt, s_gt, s_vt,
                                                                t + 1, mask_k, mask_v, T)
                else:
                    q, kk, g, v = _gla_token(q_rows, k_rows, g_rows, v_row, s_qt, s_kt, s_gt, s_vt, t, mask_k,
                                             mask_v, T)
                st = decayed_update(S, tl.exp(g), kk, v)  # as the decode kernel, bit for bit
                if not COMMIT:
                    out += tl.where(rows_t[:, None] == t, tl.sum((q * qk_scale)[:, None] * st, axis=0)[None, :],
                                    0.0)
                S, old_scale = store_verified_state(
                    st, old_scale, t, steps, position, seed, slot, h, offs_k, mask_k, mask_v,
                    static_ptr + h * K + offs_k, ptrs, sc_ptrs,
                    kept_ptr + b * s_eb + t * s_et + h * s_eh + offs_k[:, None] * s_ek + offs_v[None, :],
                    kept_scale_ptr + b * s_fb + t * s_ft + h * s_fh + offs_k,
                    K, V, BLOCK_K, BLOCK_V, FMT, RENORM, QMAX, SR, KEEP, COMMIT)
        if not COMMIT:
            tl.store(o_ptr + b * s_ob + rows_t[:, None] * s_ot + h * s_oh + offs_v[None, :],
                     out.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
                     mask=(rows_t < T)[:, None] & mask_v[None, :])

    @triton.jit
    def _gla_verify_chunk_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, o_ptr, state_ptr, scale_ptr, idx_ptr,
        s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk, s_vb, s_vt, s_vh, s_vv, s_gb, s_gt, s_gh, s_gk,
        s_ob, s_ot, s_oh, s_sp, s_sh, s_sk, s_cp, s_ch, T, qk_scale,
        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
        BLOCK_T: tl.constexpr, FMT: tl.constexpr, LOW_PRECISION: tl.constexpr,
    ):
        """numerics="prefill": the T tokens as one chunk of a prefill, from the stored state ``S0``:
        ``o = (q * exp(G)) S0 + (causal decayed scores) v`` on the tensor cores (bf16 operands for bf16 inputs, as
        the chunked prefill; else float32-accurate); a chunk whose decay does not split (:func:`chunk_decay_splits`)
        runs its tokens one by one from ``S0`` instead."""
        b, h, offs_k, mask_k, offs_v, mask_v, rows, mask_t, S0 = verify_chunk_program(
            state_ptr, scale_ptr, idx_ptr, s_sp, s_sh, s_sk, s_cp, s_ch, T, H, K, V, BLOCK_K, BLOCK_V, BLOCK_T, FMT)
        q_rows = q_ptr + b * s_qb + h * s_qh + offs_k * s_qk
        k_rows = k_ptr + b * s_kb + h * s_kh + offs_k * s_kk
        g_rows = g_ptr + b * s_gb + h * s_gh + offs_k * s_gk
        v_row = v_ptr + b * s_vb + h * s_vh + offs_v * s_vv
        o_row = o_ptr + b * s_ob + h * s_oh + offs_v
        mtk = mask_t[:, None] & mask_k[None, :]
        mtv = mask_t[:, None] & mask_v[None, :]
        G = tl.cumsum(token_tile(g_rows, s_gt, rows, mtk), axis=0)
        if chunk_decay_splits(G, rows, T):
            q = token_tile(q_rows, s_qt, rows, mtk) * qk_scale
            k = token_tile(k_rows, s_kt, rows, mtk)
            v = token_tile(v_row, s_vt, rows, mtv)
            A = decayed_scores(q, q, k, G, rows, T, BLOCK_T, False, LOW_PRECISION)[0]
            o = mm(q * tl.exp(G), S0, LOW_PRECISION, True) + mm(A, v, LOW_PRECISION, True)
            tl.store(o_row[None, :] + rows[:, None] * s_ot, o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
                     mask=mtv)
        else:  # the recurrence token by token (every decay factor <= 1)
            S = S0
            for t in range(0, T):
                q, kk, g, v = _gla_token(q_rows, k_rows, g_rows, v_row, s_qt, s_kt, s_gt, s_vt, t, mask_k, mask_v, T)
                S = decayed_update(S, tl.exp(g), kk, v)
                tl.store(o_row + t * s_ot, tl.sum((q * qk_scale)[:, None] * S, axis=0).to(
                    o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask_v)


def gla_verify(q, k, v, g, state, scale, pool_idx, quantizer: StateQuantizer, n_stores=None,
               qk_scale: float | None = None, seed: int = 0, kept: Kept | None = None,
               out: torch.Tensor | None = None, block_v: int | None = None, num_warps: int | None = None,
               block_k: int | None = None, prefetch: bool | None = None, numerics: str = "decode"):
    """Triton verify step: q, k, g ``[B, T, H, K]``, v ``[B, T, H, V]``, ``T`` in 1..16; the pool as
    :func:`~laquant.kernels.gla.decode.gla_decode_step` takes it (left unchanged). Returns ``o``
    ``[B, T, H, V]``; ``kept`` (optional, :class:`Kept`) receives the state after each token.
    ``numerics``: ``"decode"`` or ``"prefill"`` (:mod:`~laquant.kernels.common.pool_steps`). The
    launch (blocks, warps, prefetch) defaults to :data:`~laquant.kernels.common.state_io.VERIFY_LAUNCH`'s
    (its commit entry for the commit) for this many programs."""
    return _launch(q, k, v, g, state, scale, pool_idx, quantizer, n_stores, qk_scale, seed, kept, None, out,
                   verify_step(numerics, kept),
                   dict(block_v=block_v, num_warps=num_warps, block_k=block_k, prefetch=prefetch))


def gla_commit(q, k, v, g, state, scale, pool_idx, quantizer: StateQuantizer, accepted, n_stores=None,
               qk_scale: float | None = None, seed: int = 0, block_v: int | None = None,
               num_warps: int | None = None, block_k: int | None = None, prefetch: bool | None = None) -> None:
    """Accept ``accepted[b]`` (an int or ``[B]``, each ``0..T``) of the verified tokens: the slot gets
    the state after them, computed again from the same inputs (a read and a write of the state)."""
    n = accepted_counts(accepted, q.shape[0], q.shape[1], q.device)
    _launch(q, k, v, g, state, scale, pool_idx, quantizer, n_stores, qk_scale, seed, None, n, None, "commit",
            dict(block_v=block_v, num_warps=num_warps, block_k=block_k, prefetch=prefetch))


def _launch(q, k, v, g, state, scale, pool_idx, quantizer, n_stores, qk_scale, seed, kept, steps, out, step, launch):
    if triton is None:
        raise RuntimeError("Triton is not installed; use gla_verify_reference")
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_tokens(T)
    if k.shape != q.shape or g.shape != q.shape or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"expected q, k, g [B, T, H, K] and v [B, T, H, V]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, g {tuple(g.shape)}, v {tuple(v.shape)}")
    if tuple(state.shape[1:]) != (H, K, V):
        raise ValueError(f"state pool must be [P, H, K, V] = [P, {H}, {K}, {V}]; got {tuple(state.shape)}")
    pool, pool_strides, consts, num_warps, n_v = launch_args(state, scale, pool_idx, n_stores, quantizer, H, K, V,
                                                             "gla", step, **launch)
    o = out if out is not None else (v.new_empty(B, T, H, V) if steps is None else v)
    if step == "verify_prefill":  # numerics="prefill": one chunk
        launch_kernel(_gla_verify_chunk_kernel, (B * H, n_v),
            q, k, v, g, o, *pool[:3], *q.stride(), *k.stride(), *v.stride(), *g.stride(), *o.stride()[:3],
            *pool_strides, T, K ** -0.5 if qk_scale is None else qk_scale, H=H, K=K, V=V,
            **chunk_launch(consts, T, q.dtype), num_warps=num_warps)
        return o
    keep_ptrs, keep_strides = kept_args(kept, state, B, T, state)
    launch_kernel(_gla_verify_kernel, (B * H, n_v),
        q, k, v, g, o, *pool, *keep_ptrs, steps if steps is not None else pool_idx,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *o.stride()[:3], *pool_strides, *keep_strides,
        T, K ** -0.5 if qk_scale is None else qk_scale, seed, H=H, K=K, V=V, BLOCK_T=1 << (T - 1).bit_length(),
        KEEP=kept is not None, COMMIT=steps is not None, num_warps=num_warps, **consts,
    )
    return o
