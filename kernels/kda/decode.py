"""Triton kernel: one Kimi Delta Attention (KDA) decode step on a state pool, the state read and written in place.

``state[pool_idx[b]]`` (``[Hv, K, V]`` per slot, in any of the decode formats of
:mod:`laquant.kernels.gla.decode`) is loaded, each K row decayed by its own ``exp(g[c])``,
corrected by the delta rule, read out and stored back in its format, in float32 registers. This
is the gated delta rule's decode kernel (:mod:`laquant.kernels.delta.decode`), which takes a
log-decay per K row; the per-head rule passes one with stride 0. Spec:
:func:`kda_decode_step_reference`, which is :func:`~laquant.kernels.kda.reference.recurrent_kda_step`
plus the pool and the format.
"""

from __future__ import annotations

import torch

from ..common.state import StateQuantizer
from ..delta.decode import launch_decode, pool_step_reference, triton
from .reference import recurrent_kda_step


def kda_decode_step_reference(q, k, v, g, beta, state, scale, pool_idx, quantizer: StateQuantizer,
                              n_stores: torch.Tensor | None = None, qk_scale: float | None = None,
                              use_qk_l2norm: bool = False, seed: int = 0):
    """What the kernel computes, in PyTorch. Updates ``state``/``scale`` in place; returns ``o``
    ``[B, Hv, V]`` in ``v.dtype``."""
    return pool_step_reference(recurrent_kda_step, q, k, v, g, beta, state, scale, pool_idx, quantizer, n_stores,
                               qk_scale, use_qk_l2norm, seed)


def kda_decode_step(q, k, v, g, beta, state, scale, pool_idx, quantizer: StateQuantizer,
                    n_stores: torch.Tensor | None = None, qk_scale: float | None = None,
                    use_qk_l2norm: bool = False, block_k: int | None = None, num_warps: int | None = None,
                    out: torch.Tensor | None = None, seed: int = 0, early_state: bool = False) -> torch.Tensor:
    """Triton decode step. q, k ``[B, Hk, K]``, v ``[B, Hv, V]``, g (log-decay) ``[B, Hv, K]``, beta
    ``[B, Hv]``; ``state`` ``[P, Hv, K, V]`` with V contiguous; ``scale`` ``[P, Hv, K]`` float32
    (scaled formats only); ``pool_idx`` ``[B]`` int32. The slots are updated in place (``n_stores``
    is read, not incremented: the caller counts; stochastic rounding keys its bits by ``seed``). Returns ``o`` ``[B, Hv, V]``.
    ``early_state``: as :func:`~laquant.kernels.delta.decode.delta_decode_step`'s."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use kda_decode_step_reference")
    B, Hk, K = q.shape
    H = v.shape[1]
    if k.shape != q.shape or v.shape[0] != B or H % Hk or g.shape != (B, H, K) or beta.shape != (B, H):
        raise ValueError(f"expected q, k [B, Hk, K], v [B, Hv, V] with Hv a multiple of Hk, g [B, Hv, K] and beta "
                         f"[B, Hv]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    return launch_decode(q, k, v, g, beta, state, scale, pool_idx, quantizer, n_stores, qk_scale, use_qk_l2norm,
                         block_k, num_warps, out, seed, early_state)
