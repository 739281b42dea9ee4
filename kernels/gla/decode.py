"""Triton kernel: one GLA decode step on a state pool, the state read and written in place.

``state[pool_idx[b]]`` (``[H, K, V]`` per slot; fp32, bf16, or fp8 e4m3 / int8 with one float32
scale per K row) is loaded, decayed, updated with ``k v^T``, read out with ``q``, and stored back in its
format, all in float32 registers. Spec: :func:`gla_decode_step_reference`, which is
:func:`laquant.kernels.recurrent_gla_step` plus the pool and the storage format
(:class:`laquant.kernels.common.state.StateQuantizer`).

One program handles one (sequence, head) and walks the K rows in blocks of ``BLOCK_K``, keeping
the whole V row in registers so the per-row absmax, and so the fp8 scale, is exact. The kernel is
memory-bound: per sequence and head it reads and writes ``K*V`` state elements plus ``K`` scales.
"""

from __future__ import annotations

import torch

from ..common.gate_treatment import treated, treatment_args
from ..common.counters import arrival_counters
from ..common.launch import launch_kernel
from ..common.pdl import pdl_launch
from ..common.sizes import next_power_of_2
from ..common.state import StateQuantizer, load_pool_slots, store_pool_slots
from ..common.state_io import pool_args
from .reference import recurrent_gla_step

try:
    import triton
    import triton.language as tl

    from ..common.counters import last_to_arrive, reset_counter
    from ..common.pdl import pdl_release
    from ..common.triton_numerics import (decayed_update, decode_state, head_state_rows, load_treated_logits,
                                          state_random_bytes, store_group_codes, store_state_rows, store_token_codes,
                                          stored_row_scale, token_code_map, wait_with_first_rows)
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def gla_decode_step_reference(q, k, v, g, state, scale, pool_idx, quantizer: StateQuantizer,
                              n_stores: torch.Tensor | None = None, qk_scale: float | None = None, seed: int = 0):
    """What the kernel computes, in PyTorch. Updates ``state``/``scale`` in place; returns ``o``."""
    o, h = recurrent_gla_step(q, k, v, g, load_pool_slots(state, scale, pool_idx, quantizer), qk_scale)
    store_pool_slots(h, state, scale, pool_idx, quantizer, n_stores, seed)
    return o


if triton is not None:

    @triton.jit
    def _gla_decode_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, o_ptr, state_ptr, scale_ptr, idx_ptr, nstore_ptr, static_ptr,
        s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_vb, s_vh, s_vv, s_gb, s_gh, s_gk, s_ob, s_oh,
        s_sp, s_sh, s_sk, s_cp, s_ch,
        qk_scale, seed, dtb_ptr, alog_ptr, d_ptr, dt_lo, dt_hi, tlo_ptr, thi_ptr, ts_ptr, s_t,
        z_ptr, s_zb, s_zh, nw_ptr, eps, src_ptr, oidx_ptr, xq_ptr, xs_ptr, xo_ptr, cnt_ptr, KQ, NO,
        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
        FMT: tl.constexpr, RENORM: tl.constexpr, QMAX: tl.constexpr, SR: tl.constexpr, PDL: tl.constexpr,
        SSD: tl.constexpr = False, HEADS_PER_GROUP: tl.constexpr = 1, DT_QUANT: tl.constexpr = False,
        DT_BOUNDS: tl.constexpr = False, DT_PER_CHANNEL: tl.constexpr = False, GNORM: tl.constexpr = False,
        CODES: tl.constexpr = False, BQ: tl.constexpr = 16, BNO: tl.constexpr = 16, HAS_OUT: tl.constexpr = False,
        EARLY_STATE: tl.constexpr = False, GROUP: tl.constexpr = 0, PREFETCH: tl.constexpr = False,
    ):
        """``SSD`` (Mamba2's step, :func:`ssd_decode_step`): g holds the heads' dt logits ``[B, H]``, v their
        inputs x; the kernel takes dt = clamp(softplus(logit + dt_bias), dt_lo, dt_hi), the head's decay
        exp(-dt exp(A_log)), updates with ``k (dt x)^T`` and adds ``D x`` to the output. q and k (C and B)
        are per group of ``HEADS_PER_GROUP`` heads. ``DT_QUANT``: the logits get a calibrated gate's treatment
        first (clamped to ``[tlo, thi]`` per head when ``DT_BOUNDS``, int8 with the head's (or one) static scale;
        the parameters ``s_t`` apart).
        ``GNORM``: the output is the head's gated RMSNorm, ``rmsnorm(o) * w * silu(z)`` (:func:`_gated_output_norm`),
        and with ``CODES`` the W8A8 codes of the token's ``H * V`` outputs for the next GEMM too (per group of
        ``GROUP`` columns where a per-group weight takes them: each head's own, no arrival counter)."""
        offs_v = tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        pid = tl.program_id(0)
        b = pid // H
        h = pid % H
        hq = h // HEADS_PER_GROUP
        # Loaded before the PDL wait, their device-memory latency overlapping the kernel before: the output norm's
        # weight (a parameter) and, with EARLY_STATE (see gla_decode_step), the slot and the first block of state
        # rows, which the walk then starts from.
        nw = 0.0
        if GNORM:
            nw = tl.load(nw_ptr + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        slot, raw0, scale0 = wait_with_first_rows(PDL, EARLY_STATE, idx_ptr, b, state_ptr, scale_ptr, h, offs_v, mask_v,
                                                  s_sp, s_sh, s_sk, s_cp, s_ch, K, BLOCK_K, FMT)
        v = tl.load(v_ptr + b * s_vb + h * s_vh + offs_v * s_vv, mask=mask_v, other=0.0).to(tl.float32)
        x = v
        decay = 0.0
        if SSD:  # the spec's op order: softplus, clamp, then dt * -exp(A_log); exp of that in the update
            if DT_QUANT:  # the head's logit in every lane: the treatment's roundings are elementwise
                lane0 = offs_v * 0
                logit = tl.max(load_treated_logits(g_ptr + b * s_gb + h * s_gh, tlo_ptr, thi_ptr, ts_ptr, lane0,
                                                   h * s_t + lane0, lane0 == 0, True, DT_BOUNDS, DT_PER_CHANNEL),
                               axis=0)
            else:
                logit = tl.load(g_ptr + b * s_gb + h * s_gh).to(tl.float32)
            dt = logit + tl.load(dtb_ptr + h).to(tl.float32)
            dt = tl.minimum(tl.maximum(tl.where(dt > 20.0, dt, tl.log(1.0 + tl.exp(dt))), dt_lo), dt_hi)
            decay = tl.exp(dt * -tl.exp(tl.load(alog_ptr + h).to(tl.float32)))
            v = x * dt
        readout = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)  # reduced over K once, after the loop
        renorm_now = False
        position = 0  # this store's count: the stochastic rounding's counter (a device value, graph-safe)
        if RENORM > 1 or SR:
            position = tl.load(nstore_ptr + slot) + 1
            if RENORM > 1:
                renorm_now = position % RENORM == 0
        q, kk, row_decay = _gla_row_inputs(0, q_ptr, k_ptr, g_ptr, b, h, hq, decay, qk_scale, s_qb, s_qh, s_qk, s_kb,
                                           s_kh, s_kk, s_gb, s_gh, s_gk, K, BLOCK_K, SSD)
        if PREFETCH:  # the next block's rows and inputs loaded before this block's arithmetic and stores, so that
            # their memory latency overlaps it (loaded after the stores, ptxas may not hoist them: they could alias)
            raw, scale = raw0, scale0
            for k0 in range(0, K, BLOCK_K):
                raw_n, scale_n = head_state_rows(state_ptr, scale_ptr, slot, h, k0 + BLOCK_K, offs_v, mask_v, s_sp,
                                                 s_sh, s_sk, s_cp, s_ch, K, BLOCK_K, FMT)
                q_n, kk_n, row_decay_n = _gla_row_inputs(k0 + BLOCK_K, q_ptr, k_ptr, g_ptr, b, h, hq, decay, qk_scale,
                                                         s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb, s_gh, s_gk, K,
                                                         BLOCK_K, SSD)
                readout = _gla_rows(raw, scale, q, kk, row_decay, k0, readout, state_ptr, scale_ptr, static_ptr, h,
                                    slot, offs_v, mask_v, v, seed, position, renorm_now, s_sp, s_sh, s_sk, s_cp, s_ch,
                                    K, V, BLOCK_K, BLOCK_V, FMT, RENORM, QMAX, SR)
                raw, scale, q, kk, row_decay = raw_n, scale_n, q_n, kk_n, row_decay_n
        else:
            readout = _gla_rows(raw0, scale0, q, kk, row_decay, 0, readout, state_ptr, scale_ptr, static_ptr, h, slot,
                                offs_v, mask_v, v, seed, position, renorm_now, s_sp, s_sh, s_sk, s_cp, s_ch, K, V,
                                BLOCK_K, BLOCK_V, FMT, RENORM, QMAX, SR)
            for k0 in range(BLOCK_K, K, BLOCK_K):
                raw, scale = head_state_rows(state_ptr, scale_ptr, slot, h, k0, offs_v, mask_v, s_sp, s_sh, s_sk,
                                             s_cp, s_ch, K, BLOCK_K, FMT)
                q, kk, row_decay = _gla_row_inputs(k0, q_ptr, k_ptr, g_ptr, b, h, hq, decay, qk_scale, s_qb, s_qh,
                                                   s_qk, s_kb, s_kh, s_kk, s_gb, s_gh, s_gk, K, BLOCK_K, SSD)
                readout = _gla_rows(raw, scale, q, kk, row_decay, k0, readout, state_ptr, scale_ptr, static_ptr, h,
                                    slot, offs_v, mask_v, v, seed, position, renorm_now, s_sp, s_sh, s_sk, s_cp, s_ch,
                                    K, V, BLOCK_K, BLOCK_V, FMT, RENORM, QMAX, SR)
        pdl_release(PDL)
        o = tl.sum(readout, axis=0)
        if SSD:
            o += x * tl.load(d_ptr + h).to(tl.float32)
        if GNORM:
            _gated_output_norm(o, b, h, offs_v, mask_v, o_ptr, s_ob, s_oh, z_ptr, s_zb, s_zh, nw, eps, src_ptr,
                               oidx_ptr, xq_ptr, xs_ptr, xo_ptr, cnt_ptr, KQ, NO, H, V, CODES, BQ, BNO, HAS_OUT,
                               BLOCK_V, GROUP)
        else:
            tl.store(o_ptr + b * s_ob + h * s_oh + offs_v,
                     o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask_v)

    @triton.jit
    def _gla_row_inputs(k0, q_ptr, k_ptr, g_ptr, b, h, hq, decay, qk_scale, s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb,
                        s_gh, s_gk, K, BLOCK_K: tl.constexpr, SSD: tl.constexpr):
        """q (times ``qk_scale``), k and the decay of state rows ``k0 .. k0 + BLOCK_K`` (0, 0 and 1 past ``K``)."""
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        q = tl.load(q_ptr + b * s_qb + hq * s_qh + offs_k * s_qk, mask=mask_k, other=0.0).to(tl.float32) * qk_scale
        kk = tl.load(k_ptr + b * s_kb + hq * s_kh + offs_k * s_kk, mask=mask_k, other=0.0).to(tl.float32)
        if SSD:
            row_decay = tl.zeros([BLOCK_K], dtype=tl.float32) + decay
        else:
            row_decay = tl.exp(tl.load(g_ptr + b * s_gb + h * s_gh + offs_k * s_gk, mask=mask_k,
                                       other=0.0).to(tl.float32))
        return q, kk, row_decay

    @triton.jit
    def _gla_rows(raw, old_scale, q, kk, row_decay, k0, readout, state_ptr, scale_ptr, static_ptr, h, slot, offs_v,
                  mask_v, v, seed, position, renorm_now, s_sp, s_sh, s_sk, s_cp, s_ch, K, V, BLOCK_K: tl.constexpr,
                  BLOCK_V: tl.constexpr, FMT: tl.constexpr, RENORM: tl.constexpr, QMAX: tl.constexpr,
                  SR: tl.constexpr):
        """One block of state rows (``raw`` as stored, from :func:`head_state_rows`, with its inputs from
        :func:`_gla_row_inputs`) decayed, updated with ``k v^T``, stored back in its format; returns ``readout`` plus
        its ``q``-weighted rows."""
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        ptrs = state_ptr + slot * s_sp + h * s_sh + offs_k[:, None] * s_sk + offs_v[None, :]
        sc_ptrs = scale_ptr + slot * s_cp + h * s_ch + offs_k
        mask = mask_k[:, None] & mask_v[None, :]
        st = decayed_update(decode_state(raw, old_scale, FMT), row_decay, kk, v)
        readout += q[:, None] * st
        new_scale = old_scale
        if FMT >= 2:
            new_scale = stored_row_scale(st, old_scale, static_ptr + h * K + offs_k, mask_k, renorm_now, RENORM, QMAX)
        rbits = 0
        if SR:
            rbits = state_random_bytes(seed, slot, position, 0, h, offs_k, 0, K, V, BLOCK_K, BLOCK_V)
        store_state_rows(st, ptrs, sc_ptrs, mask_k, mask, new_scale, FMT, SR, rbits, RENORM > 0)
        return readout

    @triton.jit
    def _gated_output_norm(o, b, h, offs_v, mask_v, o_ptr, s_ob, s_oh, z_ptr, s_zb, s_zh, nw, eps, src_ptr,
                           oidx_ptr, xq_ptr, xs_ptr, xo_ptr, cnt_ptr, KQ, NO, H: tl.constexpr, V: tl.constexpr,
                           CODES: tl.constexpr, BQ: tl.constexpr, BNO: tl.constexpr, HAS_OUT: tl.constexpr,
                           BLOCK_V: tl.constexpr = 16, GROUP: tl.constexpr = 0):
        """The head's output ``o`` (float32) through GLA's gated output norm, as the norm kernel
        (:func:`~laquant.kernels.rowwise.fused.gated_rms_norm_triton`) computes it from o as stored: o rounded to
        the output dtype, ``y = o * rsqrt(mean(o^2) + eps) * w * z sigmoid(z)`` (``nw``: w, float32), stored in
        that dtype. ``CODES``:
        the program of the token's last head to finish (an arrival counter per token) reads the token's row back
        and writes its W8A8 codes, as the norm kernel's read-back path does. ``GROUP`` (per-group codes, V a
        multiple of it): each head writes the codes and scales of its own V columns from registers (``src_ptr``:
        the weight's dest map, -1 - slot at the outlier columns) and the outlier block's slots whose column it
        holds, read back from the row it stored."""
        dtype = o_ptr.dtype.element_ty
        b64 = b.to(tl.int64)
        x = o.to(dtype, fp_downcast_rounding="rtne").to(tl.float32)
        z = tl.load(z_ptr + b64 * s_zb + h * s_zh + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / V + eps)
        y = x * rstd
        y = y * nw
        y = y * (z * tl.sigmoid(z))
        tl.store(o_ptr + b64 * s_ob + h * s_oh + offs_v, y.to(dtype), mask=mask_v)
        if CODES and GROUP:
            b_row = b64 * KQ + h * V
            dest = tl.load(src_ptr + h * V + offs_v, mask=mask_v, other=0)
            store_group_codes(y.to(dtype).to(tl.float32), mask_v & (dest >= 0), xq_ptr + b_row,
                              xs_ptr + b64 * tl.cdiv(KQ, GROUP) + h * (V // GROUP), tl.minimum(V, KQ - h * V),
                              BLOCK_V, GROUP)
            if HAS_OUT:
                tl.debug_barrier()  # every thread's part of the row is stored before it is read back
                offs_o = tl.arange(0, BNO)
                oi = tl.load(oidx_ptr + offs_o, mask=offs_o < NO, other=-1)
                mine = (offs_o < NO) & (oi >= h * V) & (oi < h * V + V)
                tl.store(xo_ptr + b64 * NO + offs_o, tl.load(o_ptr + b64 * s_ob + oi, mask=mine, other=0.0), mask=mine)
        elif CODES:
            if last_to_arrive(cnt_ptr, b, H):  # the token's last head: its whole row is stored
                src, idx = token_code_map(src_ptr, oidx_ptr, KQ, NO, BQ, BNO, HAS_OUT)
                store_token_codes(o_ptr + b64 * s_ob, src, idx, xq_ptr + b64 * KQ, xs_ptr + b, xo_ptr + b64 * NO, KQ,
                                  NO, BQ, BNO, HAS_OUT, True)
                reset_counter(cnt_ptr, b)


def gla_decode_step(q, k, v, g, state, scale, pool_idx, quantizer: StateQuantizer,
                    n_stores: torch.Tensor | None = None, qk_scale: float | None = None,
                    block_k: int | None = None, num_warps: int | None = None,
                    out: torch.Tensor | None = None, seed: int = 0, norm: tuple | None = None, packed=None,
                    early_state: bool = False, prefetch: bool | None = None):
    """Triton decode step. q, k, g ``[B, H, K]``, v ``[B, H, V]``; ``state`` ``[P, H, K, V]`` with
    V contiguous; ``scale`` ``[P, H, K]`` float32 (fp8 only); ``pool_idx`` ``[B]`` int32. The slots
    are updated in place (``n_stores`` is read, not incremented: the caller counts). A stochastic
    ``quantizer`` draws its bits keyed by ``seed``, the slot and ``n_stores + 1``. Returns ``o``.

    ``norm`` ``(z, weight, eps)``: the output is GLA's gated output norm of o in the same launch,
    ``gated_rms_norm(o, z, weight, eps)`` over each head's V (z ``[B, H, V]``, its last dimension contiguous;
    weight ``[V]``), what :func:`~laquant.kernels.rowwise.fused.gated_rms_norm_triton` gives on the o this
    step returns without it. ``packed`` (with ``norm``): also the W8A8 codes of each token's ``H * V`` outputs
    for that GEMM (:class:`~laquant.kernels.rowwise.fused.GemmCodes`), as the norm writes them: returns
    ``(o, codes)``.

    ``early_state``: with programmatic dependent launch (decode sizes on Hopper, :mod:`..common.pdl`) the kernel
    loads the slots and each head's first block of state rows before waiting for the kernel launched just before it
    on the stream, so their device-memory latency overlaps that kernel's tail. Only for callers where that kernel
    writes neither (a model layer's projection or conv precedes the step); two steps on one pool back to back would
    read the state before the first had stored it. ``prefetch``: the walk loads each next block of state rows before
    this block's arithmetic (by default as :data:`~..common.state_io.DECODE_PREFETCH` says for this launch size)."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use gla_decode_step_reference")
    B, H, K = q.shape
    V = v.shape[-1]
    pool, pool_strides, consts, num_warps = pool_args(state, scale, pool_idx, n_stores, quantizer, H, K, block_k,
                                                      num_warps, prefetch=prefetch)
    o = torch.empty(B, H, V, dtype=v.dtype, device=v.device) if out is None else out
    qk_scale = K ** -0.5 if qk_scale is None else qk_scale
    norm_args, codes = _output_norm_args(norm, packed, o, v)
    launch_kernel(_gla_decode_kernel, (B * H,),
        q, k, v, g, o, *pool,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(),
        o.stride(0), o.stride(1), *pool_strides,
        qk_scale, seed, o, o, o, 0.0, 0.0, o, o, o, 0, *norm_args["ptrs"], H=H, K=K, V=V, BLOCK_V=next_power_of_2(V),
        num_warps=num_warps, **consts, **norm_args["consts"], EARLY_STATE=early_state, **pdl_launch(v.device, B),
    )
    return o if packed is None else (o, codes)


def _output_norm_args(norm, packed, o, v):
    """The gated output norm's launch arguments (placeholders without ``norm``) and the codes' buffers."""
    if norm is None:
        if packed is not None:
            raise ValueError("codes for the next GEMM come with the gated output norm: pass norm=(z, weight, eps)")
        return dict(ptrs=(o, 0, 0, o, 0.0, o, o, o, o, o, o, 0, 0), consts={}), None
    from ..rowwise.fused import check_codes, codes_consts, empty_codes

    z, weight, eps = norm
    B, H, V = o.shape
    if z.shape != v.shape or z.stride(-1) != 1:
        raise ValueError(f"the output gate z must be [B, H, V] = {tuple(v.shape)} with V contiguous; "
                         f"got {tuple(z.shape)} strides {z.stride()}")
    if weight.numel() != V:
        raise ValueError(f"the output norm's weight has {weight.numel()} elements, not one per head column ({V})")
    consts = dict(GNORM=True)
    if packed is None:
        return dict(ptrs=(z, z.stride(0), z.stride(1), weight, eps, o, o, o, o, o, o, 0, 0), consts=consts), None
    check_codes(packed, H * V)
    if not o.is_contiguous():
        raise ValueError("the codes of a token are read back from its output row: out must be contiguous")
    if packed.group and V % packed.group:
        raise ValueError(f"per-group codes from the decode kernel need whole groups a head: V = {V} is not a "
                         f"multiple of {packed.group}")
    codes = empty_codes(B, packed, o.dtype, o.device)
    KQ, NO = packed.qweight.shape[1], packed.outlier_idx.numel()
    consts.update(CODES=True, GROUP=packed.group, **codes_consts(packed))
    ptrs = (z, z.stride(0), z.stride(1), weight, eps, packed.dest if packed.group else packed.source,
            packed.outlier_idx, *codes, arrival_counters(o.device), KQ, NO)
    return dict(ptrs=ptrs, consts=consts), codes


def ssd_decode_step_reference(C, B_, x, dt_logits, dt_bias, A_log, D, time_step_limit, state, scale, pool_idx,
                              quantizer: StateQuantizer, n_stores: torch.Tensor | None = None, seed: int = 0,
                              dt_treatment: dict | None = None):
    """Mamba2's (SSD) decode step in PyTorch, as laquant's Mamba2 mixer's glue runs it around
    :func:`gla_decode_step_reference`:
    C, B_ ``[B, G, N]`` (per group), x ``[B, H, P]``, the dt logits ``[B, H]``; ``dt = clamp(softplus(logit +
    dt_bias))``, decay ``exp(-dt exp(A_log))`` per head, ``S = decay S + B^T (dt x)``, ``y = C S + D x``.
    ``dt_treatment``: a calibrated gate's (:meth:`~laquant.quant.modules.QuantGate.logit_treatment`), applied to the
    logits first. Updates ``state``/``scale`` in place; returns ``y`` ``[B, H, P]`` in float32."""
    H, G = x.shape[1], C.shape[1]
    dt_logits = treated(dt_logits, dt_treatment)
    lo, hi = time_step_limit if time_step_limit is not None else (0.0, float("inf"))
    dt = torch.nn.functional.softplus(dt_logits.float() + dt_bias.float()).clamp(lo, hi)
    g = (dt * -A_log.float().exp()).unsqueeze(-1).expand(*dt.shape, C.shape[-1])
    q, k = (t.float().repeat_interleave(H // G, dim=1) for t in (C, B_))
    y = gla_decode_step_reference(q, k, x.float() * dt.unsqueeze(-1), g, state, scale, pool_idx, quantizer, n_stores,
                                  1.0, seed)
    return y + x.float() * D.float()[:, None]


def ssd_decode_step(C, B_, x, dt_logits, dt_bias, A_log, D, time_step_limit, state, scale, pool_idx,
                    quantizer: StateQuantizer, n_stores: torch.Tensor | None = None, seed: int = 0,
                    out: torch.Tensor | None = None, dt_treatment: dict | None = None, block_k: int | None = None,
                    num_warps: int | None = None, early_state: bool = False,
                    prefetch: bool | None = None) -> torch.Tensor:
    """:func:`ssd_decode_step_reference` in one launch of the GLA decode kernel (its ``SSD`` mode): the gate
    treatment of the dt logits, the time step, the decay, ``dt x``, the groups' C and B (read in place: any
    strides) and ``D x`` inside. Returns ``y`` ``[B, H, P]`` float32, or in ``out``'s dtype (on the GPU rounded
    once, to nearest even, as ``.to(dtype)`` rounds the float32 spec; Triton's interpreter truncates).
    ``block_k`` / ``num_warps``: the launch (rows a block, warps a program); by default the decode table's
    (:func:`~..common.state_io.decode_launch`, ``"ssd"``) for this many programs on this GPU. ``early_state``: as
    :func:`gla_decode_step`'s, and so is ``prefetch``."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use ssd_decode_step_reference")
    Bsz, H, P = x.shape
    G, N = C.shape[1], C.shape[2]
    if H % G:
        raise ValueError(f"{H} heads do not split into {G} groups")
    lo, hi = time_step_limit if time_step_limit is not None else (0.0, float("inf"))
    pool, pool_strides, consts, num_warps = pool_args(state, scale, pool_idx, n_stores, quantizer, H, N, block_k,
                                                      num_warps, "ssd", prefetch)
    o = torch.empty(Bsz, H, P, dtype=torch.float32, device=x.device) if out is None else out
    per_head = None if dt_treatment is None else {k: None if t is None else t.reshape(1, -1)
                                                  for k, t in dt_treatment.items()}
    (t_lo, t_hi, t_scale), (_, s_t), t_consts = treatment_args(per_head, o, 1, H)
    launch_kernel(_gla_decode_kernel, (Bsz * H,),
        C, B_, x, dt_logits, o, *pool,
        *C.stride(), *B_.stride(), *x.stride(), dt_logits.stride(0), dt_logits.stride(1), 0,
        o.stride(0), o.stride(1), *pool_strides,
        1.0, seed, dt_bias, A_log, D, float(lo), float(hi), t_lo, t_hi, t_scale, s_t,
        *_output_norm_args(None, None, o, x)[0]["ptrs"], H=H, K=N, V=P,
        BLOCK_V=next_power_of_2(P), num_warps=num_warps, SSD=True, HEADS_PER_GROUP=H // G,
        **{f"DT_{k}": v for k, v in t_consts.items()}, **consts, EARLY_STATE=early_state, **pdl_launch(x.device, Bsz),
    )
    return o
