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

from ..common.pdl import pdl_launch
from ..common.state import StateQuantizer, load_pool_slots, store_pool_slots
from ..common.state_io import pool_args
from .reference import recurrent_gla_step

try:
    import triton
    import triton.language as tl

    from ..common.pdl import pdl_release, pdl_wait
    from ..common.triton_numerics import (decayed_update, load_state_rows, state_random_bytes, store_state_rows,
                                          stored_row_scale)
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
        qk_scale, seed,
        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
        FMT: tl.constexpr, RENORM: tl.constexpr, QMAX: tl.constexpr, SR: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl_wait(PDL)
        pid = tl.program_id(0)
        b = pid // H
        h = pid % H
        slot = tl.load(idx_ptr + b).to(tl.int64)
        offs_v = tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        v = tl.load(v_ptr + b * s_vb + h * s_vh + offs_v * s_vv, mask=mask_v, other=0.0).to(tl.float32)
        readout = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)  # reduced over K once, after the loop
        renorm_now = False
        position = 0  # this store's count: the stochastic rounding's counter (a device value, graph-safe)
        if RENORM > 1 or SR:
            position = tl.load(nstore_ptr + slot) + 1
            if RENORM > 1:
                renorm_now = position % RENORM == 0
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            q = tl.load(q_ptr + b * s_qb + h * s_qh + offs_k * s_qk, mask=mask_k, other=0.0).to(tl.float32) * qk_scale
            kk = tl.load(k_ptr + b * s_kb + h * s_kh + offs_k * s_kk, mask=mask_k, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + b * s_gb + h * s_gh + offs_k * s_gk, mask=mask_k, other=0.0).to(tl.float32)
            ptrs = state_ptr + slot * s_sp + h * s_sh + offs_k[:, None] * s_sk + offs_v[None, :]
            sc_ptrs = scale_ptr + slot * s_cp + h * s_ch + offs_k
            mask = mask_k[:, None] & mask_v[None, :]
            st, old_scale = load_state_rows(ptrs, sc_ptrs, mask_k, mask, FMT, BLOCK_K)
            st = decayed_update(st, tl.exp(g), kk, v)
            readout += q[:, None] * st
            new_scale = old_scale
            if FMT >= 2:
                new_scale = stored_row_scale(st, old_scale, static_ptr + h * K + offs_k, mask_k, renorm_now, RENORM,
                                             QMAX)
            rbits = 0
            if SR:
                rbits = state_random_bytes(seed, slot, position, 0, h, offs_k, 0, K, V, BLOCK_K, BLOCK_V)
            store_state_rows(st, ptrs, sc_ptrs, mask_k, mask, new_scale, FMT, SR, rbits)
        pdl_release(PDL)
        o = tl.sum(readout, axis=0)
        tl.store(o_ptr + b * s_ob + h * s_oh + offs_v, o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=mask_v)


def gla_decode_step(q, k, v, g, state, scale, pool_idx, quantizer: StateQuantizer,
                    n_stores: torch.Tensor | None = None, qk_scale: float | None = None,
                    block_k: int | None = None, num_warps: int | None = None,
                    out: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
    """Triton decode step. q, k, g ``[B, H, K]``, v ``[B, H, V]``; ``state`` ``[P, H, K, V]`` with
    V contiguous; ``scale`` ``[P, H, K]`` float32 (fp8 only); ``pool_idx`` ``[B]`` int32. The slots
    are updated in place (``n_stores`` is read, not incremented: the caller counts). A stochastic
    ``quantizer`` draws its bits keyed by ``seed``, the slot and ``n_stores + 1``. Returns ``o``."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use gla_decode_step_reference")
    B, H, K = q.shape
    V = v.shape[-1]
    pool, pool_strides, consts, num_warps = pool_args(state, scale, pool_idx, n_stores, quantizer, H, K, block_k,
                                                      num_warps)
    o = torch.empty(B, H, V, dtype=v.dtype, device=v.device) if out is None else out
    qk_scale = K ** -0.5 if qk_scale is None else qk_scale
    _gla_decode_kernel[(B * H,)](
        q, k, v, g, o, *pool,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(),
        o.stride(0), o.stride(1), *pool_strides,
        qk_scale, seed, H=H, K=K, V=V, BLOCK_V=triton.next_power_of_2(V), num_warps=num_warps, **consts,
        **pdl_launch(v.device, B),
    )
    return o
