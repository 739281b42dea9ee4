"""Triton kernel: one gated-delta-rule decode step on a state pool, the state read and written in place.

``state[pool_idx[b]]`` (``[Hv, K, V]`` per slot, in any of the decode formats of
:mod:`laquant.kernels.gla.decode`) is loaded, decayed, corrected by the delta rule, read out
and stored back in its format, in float32 registers. Spec: :func:`delta_decode_step_reference`,
which is :func:`laquant.kernels.recurrent_gated_delta_rule_step` plus the pool and the format.

Unlike GLA the update reads the state first (``k^T S``), so one program per (sequence, value head)
makes two passes over the K rows in blocks of ``BLOCK_K``: the first accumulates ``k^T S``, the
second (whose loads hit in cache) updates, reads out and stores each row. The whole V row stays in
one program, so per-row scales are exact. q and k may have fewer heads than v (grouped heads:
value head ``h`` reads key head ``h // (Hv // Hk)``) and are l2-normalised in the kernel on request.
It compiles without mul+add contraction (``enable_fp_fusion=False``, as the verify kernel), so that
at the same blocks the two store the same state bits.
The kernel takes a log-decay per K row (KDA's, :mod:`laquant.kernels.kda.decode`); the per-head
one here is that with stride 0. Memory-bound: per sequence and head it reads and writes ``K*V``
state elements plus ``K`` scales.
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.pdl import pdl_launch
from ..common.sizes import next_power_of_2
from ..common.state import StateQuantizer, load_pool_slots, store_pool_slots
from ..common.state_io import pool_args
from .reference import l2_normalize, recurrent_gated_delta_rule_step

try:
    import triton
    import triton.language as tl

    from ..common.pdl import pdl_release
    from ..common.triton_numerics import (decayed_update, decode_state, load_state_rows, state_random_bytes,
                                          store_state_rows, stored_row_scale, wait_with_first_rows)
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def delta_decode_step_reference(q, k, v, g, beta, state, scale, pool_idx, quantizer: StateQuantizer,
                                n_stores: torch.Tensor | None = None, qk_scale: float | None = None,
                                use_qk_l2norm: bool = False, seed: int = 0):
    """What the kernel computes, in PyTorch. Updates ``state``/``scale`` in place; returns ``o``
    ``[B, Hv, V]`` in ``v.dtype``."""
    return pool_step_reference(recurrent_gated_delta_rule_step, q, k, v, g, beta, state, scale, pool_idx, quantizer,
                               n_stores, qk_scale, use_qk_l2norm, seed)


def pool_step_reference(step, q, k, v, g, beta, state, scale, pool_idx, quantizer, n_stores, qk_scale, use_qk_l2norm,
                        seed):
    """One recurrent ``step`` (the gated delta rule's, KDA's) on the pool slots, as the decode kernel
    runs it: grouped q/k heads repeated, optional l2norm, the state loaded from and stored in its format."""
    o, h = prepared_step(step, q, k, v, g, beta, load_pool_slots(state, scale, pool_idx, quantizer), qk_scale,
                         use_qk_l2norm)
    store_pool_slots(h, state, scale, pool_idx, quantizer, n_stores, seed)
    return o


def prepared_step(step, q, k, v, g, beta, h, qk_scale, use_qk_l2norm):
    """One recurrent ``step`` from the float32 states ``h`` as the kernels run it: grouped q/k heads
    repeated, optional l2norm. Returns ``(o in v.dtype, new h)``."""
    r = v.shape[1] // q.shape[1]
    q, k = (x.float().repeat_interleave(r, dim=1) for x in (q, k))
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    o, h = step(q, k, v.float(), g.float(), beta.float(), h, qk_scale)
    return o.to(v.dtype), h


if triton is not None:

    @triton.jit
    def _first_pass_rows(st, k0, kS, q_sq, k_sq, k_base, q_base, g_base, s_kk, s_qk, s_gk, K, BLOCK_K: tl.constexpr,
                         L2NORM: tl.constexpr):
        """Rows ``k0 .. k0 + BLOCK_K`` (``st``, float32) of the first pass: their share of ``k^T S`` of the decayed
        state and of the squared norms of q and k (``L2NORM``)."""
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        kk = tl.load(k_base + offs_k * s_kk, mask=mask_k, other=0.0).to(tl.float32)
        if L2NORM:
            qq = tl.load(q_base + offs_k * s_qk, mask=mask_k, other=0.0).to(tl.float32)
            q_sq += qq * qq
            k_sq += kk * kk
        decay = tl.exp(tl.load(g_base + offs_k * s_gk, mask=mask_k, other=0.0).to(tl.float32))
        return tl.fma(tl.broadcast_to((kk * decay)[:, None], st.shape), st, kS), q_sq, k_sq

    @triton.jit
    def _update_rows(st, old_scale, kk, decay, delta, ptrs, scale_ptrs, static_ptrs, mask_k, mask, renorm_now,
                     seed, slot, position, h, offs_k, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr,
                     BLOCK_V: tl.constexpr, FMT: tl.constexpr, RENORM: tl.constexpr, QMAX: tl.constexpr,
                     SR: tl.constexpr):
        """Rows ``offs_k`` of the step's second half: ``S = Diag(decay) S + k delta^T`` stored back in
        its format; returns the updated rows in float32 (the caller reads them out with ``q``)."""
        st = decayed_update(st, decay, kk, delta)
        new_scale = old_scale
        if FMT >= 2:
            new_scale = stored_row_scale(st, old_scale, static_ptrs, mask_k, renorm_now, RENORM, QMAX)
        rbits = 0
        if SR:
            rbits = state_random_bytes(seed, slot, position, 0, h, offs_k, 0, K, V, BLOCK_K, BLOCK_V)
        store_state_rows(st, ptrs, scale_ptrs, mask_k, mask, new_scale, FMT, SR, rbits, RENORM > 0)
        return st

    @triton.jit
    def _delta_decode_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, state_ptr, scale_ptr, idx_ptr, nstore_ptr, static_ptr,
        s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_vb, s_vh, s_vv, s_gb, s_gh, s_gk, s_bb, s_bh, s_ob, s_oh,
        s_sp, s_sh, s_sk, s_cp, s_ch,
        qk_scale, seed,
        H: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr, FMT: tl.constexpr, RENORM: tl.constexpr, QMAX: tl.constexpr, SR: tl.constexpr, L2NORM: tl.constexpr,
        PDL: tl.constexpr, EARLY_STATE: tl.constexpr = False,
    ):
        pid = tl.program_id(0)
        b = pid // H
        h = pid % H
        hk = h // GROUP
        offs_v = tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        # the slot and the first block of state rows before the PDL wait with EARLY_STATE (see delta_decode_step)
        slot, raw0, scale0 = wait_with_first_rows(PDL, EARLY_STATE, idx_ptr, b, state_ptr, scale_ptr, h, offs_v, mask_v,
                                                  s_sp, s_sh, s_sk, s_cp, s_ch, K, BLOCK_K, FMT)
        state_base = state_ptr + slot * s_sp + h * s_sh
        scale_base = scale_ptr + slot * s_cp + h * s_ch
        v = tl.load(v_ptr + b * s_vb + h * s_vh + offs_v * s_vv, mask=mask_v, other=0.0).to(tl.float32)
        g_base = g_ptr + b * s_gb + h * s_gh  # the log-decay of each K row (stride 0: one per head)
        beta = tl.load(beta_ptr + b * s_bb + h * s_bh).to(tl.float32)
        q_base = q_ptr + b * s_qb + hk * s_qh
        k_base = k_ptr + b * s_kb + hk * s_kh
        renorm_now = False
        position = 0  # this store's count: the stochastic rounding's counter (a device value, graph-safe)
        if RENORM > 1 or SR:
            position = tl.load(nstore_ptr + slot) + 1
            if RENORM > 1:
                renorm_now = position % RENORM == 0

        if BLOCK_K >= K:  # one block: the tile stays in registers between k^T S and the update
            offs_k = tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            mask = mask_k[:, None] & mask_v[None, :]
            kk = tl.load(k_base + offs_k * s_kk, mask=mask_k, other=0.0).to(tl.float32)
            qq = tl.load(q_base + offs_k * s_qk, mask=mask_k, other=0.0).to(tl.float32)
            q_mul = qk_scale
            k_mul = 1.0
            if L2NORM:  # as fla and transformers: x * rsqrt(sum(x^2) + 1e-6)
                q_mul = qk_scale * tl.rsqrt(tl.sum(qq * qq, axis=0) + 1e-6)
                k_mul = tl.rsqrt(tl.sum(kk * kk, axis=0) + 1e-6)
            decay = tl.exp(tl.load(g_base + offs_k * s_gk, mask=mask_k, other=0.0).to(tl.float32))
            ptrs = state_base + offs_k[:, None] * s_sk + offs_v[None, :]
            st, old_scale = decode_state(raw0, scale0, FMT), scale0
            delta = beta * (v - k_mul * tl.sum((kk * decay)[:, None] * st, axis=0))
            st = _update_rows(st, old_scale, kk * k_mul, decay, delta, ptrs, scale_base + offs_k,
                              static_ptr + h * K + offs_k, mask_k, mask, renorm_now, seed, slot, position, h, offs_k,
                              K, V, BLOCK_K, BLOCK_V, FMT, RENORM, QMAX, SR)
            readout = (qq * q_mul)[:, None] * st  # products summed as the verify kernel sums them
        else:
            # pass 1: the norms of q and k (when asked) and k^T S of the decayed incoming state
            q_mul = qk_scale
            k_mul = 1.0
            kS = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)  # reduced over K once, after the loop
            q_sq = tl.zeros([BLOCK_K], dtype=tl.float32)
            k_sq = tl.zeros([BLOCK_K], dtype=tl.float32)
            kS, q_sq, k_sq = _first_pass_rows(decode_state(raw0, scale0, FMT), 0, kS, q_sq, k_sq, k_base, q_base,
                                              g_base, s_kk, s_qk, s_gk, K, BLOCK_K, L2NORM)
            for k0 in range(BLOCK_K, K, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                mask_k = offs_k < K
                st, _ = load_state_rows(state_base + offs_k[:, None] * s_sk + offs_v[None, :], scale_base + offs_k,
                                        mask_k, mask_k[:, None] & mask_v[None, :], FMT, BLOCK_K)
                kS, q_sq, k_sq = _first_pass_rows(st, k0, kS, q_sq, k_sq, k_base, q_base, g_base, s_kk, s_qk, s_gk, K,
                                                  BLOCK_K, L2NORM)
            if L2NORM:  # as fla and transformers: x * rsqrt(sum(x^2) + 1e-6)
                q_mul = qk_scale * tl.rsqrt(tl.sum(q_sq, axis=0) + 1e-6)
                k_mul = tl.rsqrt(tl.sum(k_sq, axis=0) + 1e-6)
            delta = beta * (v - k_mul * tl.sum(kS, axis=0))

            # pass 2: S = Diag(exp(g)) S + k delta^T, o = q S, S stored back in its format
            readout = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                mask_k = offs_k < K
                mask = mask_k[:, None] & mask_v[None, :]
                kk = tl.load(k_base + offs_k * s_kk, mask=mask_k, other=0.0).to(tl.float32) * k_mul
                qq = tl.load(q_base + offs_k * s_qk, mask=mask_k, other=0.0).to(tl.float32) * q_mul
                decay = tl.exp(tl.load(g_base + offs_k * s_gk, mask=mask_k, other=0.0).to(tl.float32))
                ptrs = state_base + offs_k[:, None] * s_sk + offs_v[None, :]
                st, old_scale = load_state_rows(ptrs, scale_base + offs_k, mask_k, mask, FMT, BLOCK_K)
                st = _update_rows(st, old_scale, kk, decay, delta, ptrs, scale_base + offs_k,
                                  static_ptr + h * K + offs_k, mask_k, mask, renorm_now, seed, slot, position, h,
                                  offs_k, K, V, BLOCK_K, BLOCK_V, FMT, RENORM, QMAX, SR)
                readout = tl.fma(tl.broadcast_to(qq[:, None], st.shape), st, readout)
        pdl_release(PDL)
        o = tl.sum(readout, axis=0)
        tl.store(o_ptr + b * s_ob + h * s_oh + offs_v, o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=mask_v)


def delta_decode_step(q, k, v, g, beta, state, scale, pool_idx, quantizer: StateQuantizer,
                      n_stores: torch.Tensor | None = None, qk_scale: float | None = None,
                      use_qk_l2norm: bool = False, block_k: int | None = None, num_warps: int | None = None,
                      out: torch.Tensor | None = None, seed: int = 0, early_state: bool = False) -> torch.Tensor:
    """Triton decode step. q, k ``[B, Hk, K]``, v ``[B, Hv, V]``, g (log-decay) and beta ``[B, Hv]``;
    ``state`` ``[P, Hv, K, V]`` with V contiguous; ``scale`` ``[P, Hv, K]`` float32 (scaled formats
    only); ``pool_idx`` ``[B]`` int32. The slots are updated in place (``n_stores`` is read, not
    incremented: the caller counts; stochastic rounding keys its bits by ``seed``, the slot and
    ``n_stores + 1``). Returns ``o`` ``[B, Hv, V]``.

    ``early_state``: with programmatic dependent launch (decode sizes on Hopper, :mod:`..common.pdl`) the kernel
    loads the slots and each head's first block of state rows before waiting for the kernel launched just before it
    on the stream, so their device-memory latency overlaps that kernel's tail. Only for callers where that kernel
    writes neither (a model layer's projection or conv precedes the step); two steps on one pool back to back would
    read the state before the first had stored it."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use delta_decode_step_reference")
    B, Hk, K = q.shape
    H = v.shape[1]
    if k.shape != q.shape or v.shape[0] != B or H % Hk or g.shape != (B, H) or beta.shape != (B, H):
        raise ValueError(f"expected q, k [B, Hk, K], v [B, Hv, V] with Hv a multiple of Hk, g and beta [B, Hv]; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}, "
                         f"beta {tuple(beta.shape)}")
    return launch_decode(q, k, v, g.unsqueeze(-1).expand(B, H, K), beta, state, scale, pool_idx, quantizer, n_stores,
                         qk_scale, use_qk_l2norm, block_k, num_warps, out, seed, early_state)


def launch_decode(q, k, v, g, beta, state, scale, pool_idx, quantizer, n_stores, qk_scale, use_qk_l2norm, block_k,
                  num_warps, out, seed=0, early_state=False):
    """The decode kernel on checked arguments, g ``[B, Hv, K]`` a per-row log-decay (an expanded
    per-head one has stride 0 over K): the gated delta rule's and KDA's step share it."""
    B, Hk, K = q.shape
    H, V = v.shape[1], v.shape[2]
    if tuple(state.shape[1:]) != (H, K, V):
        raise ValueError(f"state pool must be [P, Hv, K, V] = [P, {H}, {K}, {V}]; got {tuple(state.shape)}")
    pool, pool_strides, consts, num_warps = pool_args(state, scale, pool_idx, n_stores, quantizer, H, K, block_k,
                                                      num_warps, "delta")
    o = torch.empty(B, H, V, dtype=v.dtype, device=v.device) if out is None else out
    launch_kernel(_delta_decode_kernel, (B * H,),
        q, k, v, g, beta, o, *pool,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
        o.stride(0), o.stride(1), *pool_strides,
        K ** -0.5 if qk_scale is None else qk_scale, seed, H=H, GROUP=H // Hk, K=K, V=V,
        BLOCK_V=next_power_of_2(V), L2NORM=use_qk_l2norm, num_warps=num_warps, **consts,
        enable_fp_fusion=False, EARLY_STATE=early_state, **pdl_launch(v.device, B),
    )
    return o
