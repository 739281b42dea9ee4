"""Triton kernel: chunked Kimi Delta Attention (KDA) prefill with the state in a format.

The gated delta rule's chunk kernel (:mod:`laquant.kernels.delta.chunk`) with a log-decay per key
channel: one program per (sequence, value head, V block) walks its sequence in chunks of ``BT``
tokens with the ``[K, V]`` state in float32 registers. Per chunk, with ``G [BT, K]`` the cumulative
log-decay, the unit-lower-triangular system ``A_ij = beta_i sum_c k_ic k_jc exp(G_ic - G_jc)`` and
the causal ``q k^T`` with the same decay are built one column at a time (``exp(G_i - G_j)`` exact
for ``j <= i``, so strong decays cannot overflow), inverted by forward substitution, and the WY
form gives ``v_new = u - w S``, ``o = (q exp(G)) S + (q k^T * D) v_new`` and
``S = Diag(exp(G_last)) S + (k exp(G_last - G))^T v_new``. State formats in, inside (every 64
tokens with ``roundtrip``) and out, ``cu_seqlens``, grouped heads and the in-kernel q/k l2norm are
the delta kernel's. Spec: :func:`chunk_kda_reference` (:func:`~laquant.kernels.kda.reference.chunk_kda`
per sequence).
"""

from __future__ import annotations

import torch

from ..common.state import State, StateQuantizer
from ..delta.chunk import launch_chunk, per_sequence_reference, triton
from .reference import chunk_kda


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
                     num_warps: int = 4, num_stages: int = 1, out: torch.Tensor | None = None,
                     rounding: str = "nearest", seed: int = 0, position: int | None = None):
    """Chunked KDA forward. q, k ``[B, T, Hk, K]``, v ``[B, T, Hv, V]`` (``Hv`` a multiple of
    ``Hk``), g (log-decay) ``[B, T, Hv, K]``, beta ``[B, T, Hv]``; ``cu_seqlens``, the state
    arguments, the launch parameters and the stochastic rounding's as
    :func:`~laquant.kernels.delta.chunk.chunk_delta_triton`.
    Returns ``(o, final_state or None)``."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use chunk_kda_reference")
    B, T, Hk, K = q.shape
    H = v.shape[2]
    if (k.shape != q.shape or v.shape[:2] != q.shape[:2] or H % Hk or g.shape != (*v.shape[:3], K)
            or beta.shape != v.shape[:3]):
        raise ValueError(f"expected q, k [B, T, Hk, K], v [B, T, Hv, V] with Hv a multiple of Hk, g [B, T, Hv, K] "
                         f"and beta [B, T, Hv]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    return launch_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, final_format, roundtrip, cu_seqlens,
                        use_qk_l2norm, block_t, block_v, num_warps, num_stages, out, rounding, seed, position)
