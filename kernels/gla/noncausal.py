"""Triton kernels: bidirectional (non-causal) linear attention, ``o = scale * q (k^T v)`` per head.

Two passes. The first sums ``k^T v`` over T-slices of each head into float32 partial ``[K, V]``
summaries (several slices per head so that long sequences fill the GPU), summed in a fixed order
afterwards, so the result is deterministic; the second multiplies each query block by the
summary. Both read their inputs once: the cost is linear in T, where softmax attention's is
quadratic. Spec: :func:`laquant.kernels.gla.reference.noncausal_linear_attention`.
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.sizes import cdiv, next_power_of_2, sm_count

try:
    import triton
    import triton.language as tl

    from ..common.triton_numerics import mm
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

if triton is not None:

    @triton.jit
    def _kv_summary_kernel(k_ptr, v_ptr, kv_ptr, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, T, tokens_per_split,
                           H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                           BK: tl.constexpr, BV: tl.constexpr, LOW_PRECISION: tl.constexpr):
        i_bh, i_s = tl.program_id(0), tl.program_id(1)  # (batch, head), split of T
        n_splits = tl.num_programs(1)
        b, h = i_bh // H, i_bh % H
        offs_k, offs_v = tl.arange(0, BK), tl.arange(0, BV)
        mk, mv = offs_k < K, offs_v < V
        acc = tl.zeros([BK, BV], dtype=tl.float32)
        t_start = i_s * tokens_per_split
        t_end = tl.minimum(t_start + tokens_per_split, T)
        for t0 in range(t_start, t_end, BT):
            offs_t = t0 + tl.arange(0, BT)
            mt = offs_t < t_end
            k = tl.load(k_ptr + b * s_kb + h * s_kh + offs_t[:, None] * s_kt + offs_k[None, :],
                        mask=mt[:, None] & mk[None, :], other=0.0)
            v = tl.load(v_ptr + b * s_vb + h * s_vh + offs_t[:, None] * s_vt + offs_v[None, :],
                        mask=mt[:, None] & mv[None, :], other=0.0)
            acc += mm(tl.trans(k), v, LOW_PRECISION)
        out = kv_ptr + ((i_bh * n_splits + i_s) * K).to(tl.int64) * V
        tl.store(out + offs_k[:, None] * V + offs_v[None, :], acc, mask=mk[:, None] & mv[None, :])

    @triton.jit
    def _apply_summary_kernel(q_ptr, kv_ptr, o_ptr, s_qb, s_qt, s_qh, s_ob, s_ot, s_oh, T, qk_scale,
                              H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                              BK: tl.constexpr, BV: tl.constexpr, LOW_PRECISION: tl.constexpr):
        i_bh, i_t = tl.program_id(0), tl.program_id(1)  # (batch, head), block of T
        b, h = i_bh // H, i_bh % H
        offs_t = i_t * BT + tl.arange(0, BT)
        offs_k, offs_v = tl.arange(0, BK), tl.arange(0, BV)
        mt = offs_t < T
        mk, mv = offs_k < K, offs_v < V
        kv = tl.load(kv_ptr + (i_bh * K).to(tl.int64) * V + offs_k[:, None] * V + offs_v[None, :],
                     mask=mk[:, None] & mv[None, :], other=0.0)
        q = tl.load(q_ptr + b * s_qb + h * s_qh + offs_t[:, None] * s_qt + offs_k[None, :],
                    mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32) * qk_scale
        o = mm(q, kv, LOW_PRECISION)
        tl.store(o_ptr + b * s_ob + h * s_oh + offs_t[:, None] * s_ot + offs_v[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=mt[:, None] & mv[None, :])


def noncausal_linear_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                      scale: float | None = None, block_t: int = 64) -> torch.Tensor:
    """q, k ``[B, T, H, K]``, v ``[B, T, H, V]`` -> o ``[B, T, H, V]`` in v's dtype."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use noncausal_linear_attention")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"expected q, k [B, T, H, K] and v [B, T, H, V]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    low = q.dtype != torch.float32
    BK, BV = next_power_of_2(K), next_power_of_2(V)
    # enough T-slices that B * H * splits programs cover the GPU a few times over
    sms = sm_count(q.device, elsewhere=4)
    splits = max(1, min(cdiv(T, block_t), cdiv(4 * sms, B * H)))
    per_split = block_t * cdiv(cdiv(T, splits), block_t)
    splits = cdiv(T, per_split) if T else 1
    partial = torch.empty(B * H, splits, K, V, dtype=torch.float32, device=q.device)
    launch_kernel(_kv_summary_kernel, (B * H, splits),
        k, v, partial, k.stride(0), k.stride(1), k.stride(2), v.stride(0),
        v.stride(1), v.stride(2), T, per_split, H=H, K=K, V=V, BT=block_t,
        BK=BK, BV=BV, LOW_PRECISION=low)
    kv = partial.sum(1)
    o = torch.empty_like(v)
    launch_kernel(_apply_summary_kernel, (B * H, cdiv(T, block_t)),
        q, kv, o, q.stride(0), q.stride(1), q.stride(2), o.stride(0), o.stride(1), o.stride(2), T,
        K ** -0.5 if scale is None else scale, H=H, K=K, V=V, BT=block_t, BK=BK, BV=BV, LOW_PRECISION=low)
    return o
