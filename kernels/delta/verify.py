"""Triton kernel: the gated delta rule's multi-token verify step on a state pool, and its commit
(KDA's per-channel decay on the same kernel, as for decode).

The contract is GLA's (:mod:`laquant.kernels.gla.verify`): ``T`` tokens per sequence (q, k
``[B, T, Hk, K]``, v ``[B, T, Hv, V]``, g ``[B, T, Hv]`` per head or ``[B, T, Hv, K]`` per channel,
beta ``[B, T, Hv]``) run from the pool slot, each token's state stored and loaded back as a
decode step would, the pool left as it was (``kept``: the state after each token); then
:func:`delta_commit` (or :func:`~laquant.kernels.common.pool_steps.commit_kept`) accepts ``n[b]`` of
them, leaving the pool bit-identical to ``n[b]`` decode steps. Spec: :func:`delta_verify_reference`.

One program per (sequence, value head, V block) holds its ``[K, BLOCK_V]`` state tile in registers
across the tokens (V columns are independent in the delta rule too: ``k^T S`` is per column). The
delta rule's update reads ``k^T S``, a sum over K: this kernel sums the whole K at once, so its
states are bit-identical to the decode kernel's when that one runs with ``block_k = K`` and the
same ``num_warps`` (its tuned blocks sum in another order: the states then agree to float32
rounding, which the format's rounding mostly absorbs). A verify step with ``numerics="prefill"`` runs its own
kernel, the tokens as one chunk (``_delta_verify_chunk_kernel``).
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.pool_steps import (Kept, accepted_counts, check_tokens, chunk_launch, kept_args, launch_args,
                                 pool_steps_reference, verify_step)
from ..common.state import StateQuantizer
from ..kda.reference import recurrent_kda_step
from .decode import prepared_step
from .reference import recurrent_gated_delta_rule_step

try:
    import triton
    import triton.language as tl

    from ..common.triton_numerics import (chunk_decay_splits, decayed_scores, decayed_update, load_state_rows, mm,
                                          store_verified_state, token_row, token_tile, unit_lower_inverse_by_squaring,
                                          verify_chunk_program)
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def _step(q, k, v, g, beta, qk_scale, use_qk_l2norm):
    rule = recurrent_kda_step if g.dim() == 4 else recurrent_gated_delta_rule_step
    return lambda t, h: prepared_step(rule, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], h, qk_scale,
                                      use_qk_l2norm)


def delta_verify_reference(q, k, v, g, beta, state, scale, pool_idx, quantizer: StateQuantizer, n_stores=None,
                           qk_scale: float | None = None, use_qk_l2norm: bool = False, seed: int = 0,
                           kept: Kept | None = None, numerics: str = "decode") -> torch.Tensor:
    """What :func:`delta_verify` computes, in PyTorch: ``o`` ``[B, T, Hv, V]``; the pool untouched."""
    step = _step(q, k, v, g, beta, qk_scale, use_qk_l2norm)
    return torch.stack(pool_steps_reference(step, q.shape[1], state, scale, pool_idx, quantizer, n_stores, seed,
                                            kept, numerics=numerics), 1)


def delta_commit_reference(q, k, v, g, beta, state, scale, pool_idx, quantizer: StateQuantizer, accepted,
                           n_stores=None, qk_scale: float | None = None, use_qk_l2norm: bool = False,
                           seed: int = 0) -> None:
    """What :func:`delta_commit` does, in PyTorch."""
    n = accepted_counts(accepted, q.shape[0], q.shape[1], q.device)
    pool_steps_reference(_step(q, k, v, g, beta, qk_scale, use_qk_l2norm), q.shape[1], state, scale, pool_idx,
                         quantizer, n_stores, seed, accepted=n)


if triton is not None:

    @triton.jit
    def _delta_token(q_rows, k_rows, g_rows, v_row, beta_at, s_qt, s_kt, s_gt, s_vt, s_bt, t, mask_k, mask_v, T):
        return (token_row(q_rows, s_qt, t, mask_k, T), token_row(k_rows, s_kt, t, mask_k, T),
                token_row(g_rows, s_gt, t, mask_k, T), token_row(v_row, s_vt, t, mask_v, T),
                tl.load(beta_at + tl.minimum(t, T - 1) * s_bt).to(tl.float32))

    @triton.jit
    def _delta_verify_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, state_ptr, scale_ptr, idx_ptr, nstore_ptr, static_ptr,
        kept_ptr, kept_scale_ptr, steps_ptr,
        s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk, s_vb, s_vt, s_vh, s_vv, s_gb, s_gt, s_gh, s_gk,
        s_bb, s_bt, s_bh, s_ob, s_ot, s_oh, s_sp, s_sh, s_sk, s_cp, s_ch, s_eb, s_et, s_eh, s_ek, s_fb, s_ft, s_fh,
        T, qk_scale, seed,
        H: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr, FMT: tl.constexpr, RENORM: tl.constexpr, QMAX: tl.constexpr, SR: tl.constexpr,
        L2NORM: tl.constexpr, KEEP: tl.constexpr, COMMIT: tl.constexpr, PREFETCH: tl.constexpr,
    ):
        pid = tl.program_id(0)
        b = pid // H
        h = pid % H
        hk = h // GROUP
        slot = tl.load(idx_ptr + b).to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        mask = mask_k[:, None] & mask_v[None, :]
        ptrs = state_ptr + slot * s_sp + h * s_sh + offs_k[:, None] * s_sk + offs_v[None, :]
        sc_ptrs = scale_ptr + slot * s_cp + h * s_ch + offs_k
        S, old_scale = load_state_rows(ptrs, sc_ptrs, mask_k, mask, FMT, BLOCK_K)
        position = 0  # the first token's store count, as the decode step's
        if RENORM > 1 or SR:
            position = tl.load(nstore_ptr + slot) + 1
        steps = T
        if COMMIT:
            steps = tl.load(steps_ptr + b)
        q_rows = q_ptr + b * s_qb + hk * s_qh + offs_k * s_qk
        k_rows = k_ptr + b * s_kb + hk * s_kh + offs_k * s_kk
        g_rows = g_ptr + b * s_gb + h * s_gh + offs_k * s_gk
        v_row = v_ptr + b * s_vb + h * s_vh + offs_v * s_vv
        beta_at = beta_ptr + b * s_bb + h * s_bh
        if PREFETCH:
            q_next, k_next, g_next, v_next, beta_next = _delta_token(q_rows, k_rows, g_rows, v_row, beta_at, s_qt,
                                                                     s_kt, s_gt, s_vt, s_bt, 0, mask_k, mask_v, T)
        for t in range(0, steps):
            # the decode kernel's expressions (kernels/delta/decode.py), its K blocks being one block here
            if PREFETCH:  # token t + 1's inputs load behind token t's arithmetic
                qq, kk, g, v, beta = q_next, k_next, g_next, v_next, beta_next
                q_next, k_next, g_next, v_next, beta_next = _delta_token(q_rows, k_rows, g_rows, v_row, beta_at, s_qt,
                                                                         s_kt, s_gt, s_vt, s_bt, t + 1, mask_k,
                                                                         mask_v, T)
            else:
                qq, kk, g, v, beta = _delta_token(q_rows, k_rows, g_rows, v_row, beta_at, s_qt, s_kt, s_gt, s_vt, s_bt,
                                                  t, mask_k, mask_v, T)
            st, o = _delta_step(S, qq, kk, g, v, beta, qk_scale, L2NORM)
            if not COMMIT:
                tl.store(o_ptr + b * s_ob + t * s_ot + h * s_oh + offs_v,
                         o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask_v)
            S, old_scale = store_verified_state(
                st, old_scale, t, steps, position, seed, slot, h, offs_k, mask_k, mask_v,
                static_ptr + h * K + offs_k, ptrs, sc_ptrs,
                kept_ptr + b * s_eb + t * s_et + h * s_eh + offs_k[:, None] * s_ek + offs_v[None, :],
                kept_scale_ptr + b * s_fb + t * s_ft + h * s_fh + offs_k,
                K, V, BLOCK_K, BLOCK_V, FMT, RENORM, QMAX, SR, KEEP, COMMIT)

    @triton.jit
    def _delta_step(S, qq, kk, g, v, beta, qk_scale, L2NORM: tl.constexpr):
        """One token of the delta rule on the float32 state tile ``S``, the decode kernel's expressions
        (``kernels/delta/decode.py``): the new state and the token's output."""
        decay = tl.exp(g)
        q_mul = qk_scale
        k_mul = 1.0
        if L2NORM:  # as fla and transformers: x * rsqrt(sum(x^2) + 1e-6)
            q_mul = qk_scale * tl.rsqrt(tl.sum(qq * qq, axis=0) + 1e-6)
            k_mul = tl.rsqrt(tl.sum(kk * kk, axis=0) + 1e-6)
        kS = (kk * decay)[:, None] * S
        delta = beta * (v - k_mul * tl.sum(kS, axis=0))
        st = decayed_update(S, decay, kk * k_mul, delta)
        return st, tl.sum((qq * q_mul)[:, None] * st, axis=0)

    @triton.jit
    def _delta_verify_chunk_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, state_ptr, scale_ptr, idx_ptr,
        s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk, s_vb, s_vt, s_vh, s_vv, s_gb, s_gt, s_gh, s_gk,
        s_bb, s_bt, s_bh, s_ob, s_ot, s_oh, s_sp, s_sh, s_sk, s_cp, s_ch, T, qk_scale,
        H: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr, FMT: tl.constexpr, L2NORM: tl.constexpr,
        LOW_PRECISION: tl.constexpr, PER_CHANNEL: tl.constexpr,
    ):
        """numerics="prefill": the T tokens as one chunk of a prefill, from the stored state ``S0``. With
        ``G`` the cumulative log-decays and ``k``, ``q`` normalized as the decode step's: the updates
        ``u = (I + A)^-1 beta (v - (k * exp(G)) S0)``, ``A`` the strictly causal decayed ``k k^T`` scores times
        beta (the delta rule's recurrence solved for all tokens at once), then
        ``o = (q * exp(G)) S0 + (causal decayed q k^T scores) u``; products on the tensor cores (bf16 operands for
        bf16 inputs, as the chunked prefill; the unit triangle's inverse and else float32-accurate). A decay per head
        (Gated DeltaNet) decays the ``[T, T]`` scores after their products, ``exp(G_t - G_s)`` as one tile (the chunked
        prefill's ``D``, :mod:`.chunk`); a decay per channel (KDA, ``PER_CHANNEL``) enters the products, split around
        the chunk's middle row (:func:`decayed_scores`), and a chunk whose decay does not split
        (:func:`chunk_decay_splits`) runs its tokens one by one from ``S0`` instead."""
        b, h, offs_k, mask_k, offs_v, mask_v, rows, mask_t, S0 = verify_chunk_program(
            state_ptr, scale_ptr, idx_ptr, s_sp, s_sh, s_sk, s_cp, s_ch, T, H, K, V, BLOCK_K, BLOCK_V, BLOCK_T, FMT)
        hk = h // GROUP
        q_rows = q_ptr + b * s_qb + hk * s_qh + offs_k * s_qk
        k_rows = k_ptr + b * s_kb + hk * s_kh + offs_k * s_kk
        g_rows = g_ptr + b * s_gb + h * s_gh + offs_k * s_gk
        v_row = v_ptr + b * s_vb + h * s_vh + offs_v * s_vv
        beta_at = beta_ptr + b * s_bb + h * s_bh
        o_row = o_ptr + b * s_ob + h * s_oh + offs_v
        mtk = mask_t[:, None] & mask_k[None, :]
        mtv = mask_t[:, None] & mask_v[None, :]
        if PER_CHANNEL:
            G = tl.cumsum(token_tile(g_rows, s_gt, rows, mtk), axis=0)
            if chunk_decay_splits(G, rows, T):
                q, k, v, beta = _chunk_inputs(q_rows, k_rows, v_row, beta_at, s_qt, s_kt, s_vt, s_bt, rows, mask_t,
                                              mtk, mtv, qk_scale, L2NORM)
                Akk, Aqk = decayed_scores(k, q, k, G, rows, T, BLOCK_T, True, LOW_PRECISION)
                o = _chunk_output(q, k, v, beta, Akk, Aqk, tl.exp(G), S0, rows, T, LOW_PRECISION)
                tl.store(o_row[None, :] + rows[:, None] * s_ot,
                         o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mtv)
            else:  # the recurrence token by token (every decay factor <= 1)
                S = S0
                for t in range(0, T):
                    qq, kk, g, v, beta = _delta_token(q_rows, k_rows, g_rows, v_row, beta_at, s_qt, s_kt, s_gt, s_vt,
                                                      s_bt, t, mask_k, mask_v, T)
                    S, o = _delta_step(S, qq, kk, g, v, beta, qk_scale, L2NORM)
                    tl.store(o_row + t * s_ot, o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask_v)
        else:  # one decay per head: g_rows' K offsets have stride 0
            G = tl.cumsum(tl.load(g_ptr + b * s_gb + h * s_gh + rows * s_gt, mask=mask_t, other=0.0).to(tl.float32),
                          axis=0)
            q, k, v, beta = _chunk_inputs(q_rows, k_rows, v_row, beta_at, s_qt, s_kt, s_vt, s_bt, rows, mask_t, mtk,
                                          mtv, qk_scale, L2NORM)
            causal = (rows[:, None] >= rows[None, :]) & mask_t[:, None]
            D = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))
            kt = tl.trans(k)
            Akk = tl.where(causal, mm(k, kt, LOW_PRECISION, True) * D, 0.0)
            Aqk = tl.where(causal, mm(q, kt, LOW_PRECISION, True) * D, 0.0)
            o = _chunk_output(q, k, v, beta, Akk, Aqk, tl.exp(G)[:, None], S0, rows, T, LOW_PRECISION)
            tl.store(o_row[None, :] + rows[:, None] * s_ot, o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
                     mask=mtv)

    @triton.jit
    def _chunk_inputs(q_rows, k_rows, v_row, beta_at, s_qt, s_kt, s_vt, s_bt, rows, mask_t, mtk, mtv, qk_scale,
                      L2NORM: tl.constexpr):
        """A one-chunk verify's ``q`` (scaled), ``k`` (normalized as the decode step's with ``L2NORM``), ``v`` and
        ``beta`` tiles of its tokens, float32."""
        q = token_tile(q_rows, s_qt, rows, mtk)
        k = token_tile(k_rows, s_kt, rows, mtk)
        v = token_tile(v_row, s_vt, rows, mtv)
        beta = tl.load(beta_at + rows * s_bt, mask=mask_t, other=0.0).to(tl.float32)
        if L2NORM:  # as the decode step: x * rsqrt(sum(x^2) + 1e-6)
            q = q * (qk_scale * tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6))[:, None]
            k = k * tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
        else:
            q = q * qk_scale
        return q, k, v, beta

    @triton.jit
    def _chunk_output(q, k, v, beta, Akk, Aqk, decay, S0, rows, T, LOW_PRECISION: tl.constexpr):
        """The chunk's outputs from the causal decayed scores ``Akk`` (``k k^T``, the diagonal included) and ``Aqk``,
        the decays from the chunk's start ``decay`` and the stored state ``S0``: the updates
        ``u = (I + A)^-1 beta (v - (k decay) S0)`` (``A``: ``Akk`` strictly below the diagonal, times beta), then
        ``o = (q decay) S0 + Aqk u``."""
        Akk = tl.where(rows[:, None] > rows[None, :], Akk, 0.0) * beta[:, None]
        u = beta[:, None] * (v - mm(k * decay, S0, LOW_PRECISION, True))
        u = mm(unit_lower_inverse_by_squaring(Akk, rows, T), u, LOW_PRECISION, True)
        return mm(q * decay, S0, LOW_PRECISION, True) + mm(Aqk, u, LOW_PRECISION, True)


def delta_verify(q, k, v, g, beta, state, scale, pool_idx, quantizer: StateQuantizer, n_stores=None,
                 qk_scale: float | None = None, use_qk_l2norm: bool = False, seed: int = 0, kept: Kept | None = None,
                 out: torch.Tensor | None = None, block_v: int | None = None, num_warps: int | None = None,
                 prefetch: bool | None = None, numerics: str = "decode"):
    """Triton verify step (shapes above, ``T`` in 1..16); the pool as the decode kernel takes it, left
    unchanged. Returns ``o`` ``[B, T, Hv, V]``; ``kept`` receives the state after each token. ``numerics``:
    ``"decode"`` or ``"prefill"`` (:mod:`~laquant.kernels.common.pool_steps`). The launch defaults to
    :data:`~laquant.kernels.common.state_io.VERIFY_LAUNCH`'s."""
    return _launch(q, k, v, g, beta, state, scale, pool_idx, quantizer, n_stores, qk_scale, use_qk_l2norm, seed,
                   kept, None, out, verify_step(numerics, kept),
                   dict(block_v=block_v, num_warps=num_warps, prefetch=prefetch))


def delta_commit(q, k, v, g, beta, state, scale, pool_idx, quantizer: StateQuantizer, accepted, n_stores=None,
                 qk_scale: float | None = None, use_qk_l2norm: bool = False, seed: int = 0,
                 block_v: int | None = None, num_warps: int | None = None, prefetch: bool | None = None) -> None:
    """Accept ``accepted[b]`` (an int or ``[B]``) of the verified tokens, computed again from the same inputs."""
    n = accepted_counts(accepted, q.shape[0], q.shape[1], q.device)
    _launch(q, k, v, g, beta, state, scale, pool_idx, quantizer, n_stores, qk_scale, use_qk_l2norm, seed, None, n,
            None, "commit", dict(block_v=block_v, num_warps=num_warps, prefetch=prefetch))


def _launch(q, k, v, g, beta, state, scale, pool_idx, quantizer, n_stores, qk_scale, use_qk_l2norm, seed, kept,
            steps, out, step, launch):
    if triton is None:
        raise RuntimeError("Triton is not installed; use delta_verify_reference")
    B, T, Hk, K = q.shape
    H, V = v.shape[2], v.shape[3]
    check_tokens(T)
    per_channel = g.dim() == 4
    g_shape = (B, T, H, K) if per_channel else (B, T, H)
    if k.shape != q.shape or tuple(v.shape[:2]) != (B, T) or H % Hk or g.shape != g_shape or \
            beta.shape != (B, T, H):
        raise ValueError(f"expected q, k [B, T, Hk, K], v [B, T, Hv, V] with Hv a multiple of Hk, g [B, T, Hv] (or "
                         f"[B, T, Hv, K]) and beta [B, T, Hv]; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    if tuple(state.shape[1:]) != (H, K, V):
        raise ValueError(f"state pool must be [P, Hv, K, V] = [P, {H}, {K}, {V}]; got {tuple(state.shape)}")
    if not per_channel:
        g = g.unsqueeze(-1).expand(B, T, H, K)  # stride 0 over K: one decay per head
    pool, pool_strides, consts, num_warps, n_v = launch_args(state, scale, pool_idx, n_stores, quantizer, H, K, V,
                                                             "delta", step, **launch)
    o = out if out is not None else (v.new_empty(B, T, H, V) if steps is None else v)
    if step == "verify_prefill":  # numerics="prefill": one chunk
        launch_kernel(_delta_verify_chunk_kernel, (B * H, n_v),
            q, k, v, g, beta, o, *pool[:3], *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
            *o.stride()[:3], *pool_strides, T, K ** -0.5 if qk_scale is None else qk_scale, H=H, GROUP=H // Hk, K=K,
            V=V, L2NORM=use_qk_l2norm, PER_CHANNEL=per_channel, **chunk_launch(consts, T, q.dtype),
            num_warps=num_warps)
        return o
    keep_ptrs, keep_strides = kept_args(kept, state, B, T, state)
    launch_kernel(_delta_verify_kernel, (B * H, n_v),
        q, k, v, g, beta, o, *pool, *keep_ptrs, steps if steps is not None else pool_idx,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(), *o.stride()[:3], *pool_strides,
        *keep_strides, T, K ** -0.5 if qk_scale is None else qk_scale, seed, H=H, GROUP=H // Hk, K=K, V=V,
        L2NORM=use_qk_l2norm, KEEP=kept is not None, COMMIT=steps is not None, num_warps=num_warps, **consts,
        enable_fp_fusion=False,
    )
    return o
