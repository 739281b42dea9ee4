"""Plain-PyTorch reference for Kimi Delta Attention (KDA): the gated delta rule with a per-channel decay.

Layout as fla (``fla.ops.kda``) and transformers (``kimi_linear``): q, k ``[B, T, Hk, K]``, v
``[B, T, Hv, V]``, g (log-decay, ``<= 0``) ``[B, T, Hv, K]`` (one decay per key channel, per value
head), beta ``[B, T, Hv]``, state ``[B, Hv, K, V]``; each q/k head serves ``Hv // Hk`` consecutive
value heads. With ``S`` the state and ``scale = K ** -0.5``::

    S_t = Diag(exp(g_t)) S_{t-1}                         (row c of S decays by exp(g_t[c]))
    S_t = S_t + k_t^T (beta_t (v_t - k_t S_t))            (the delta rule: write only the correction)
    o_t = (scale * q_t) S_t

i.e. ``S_t = (I - beta_t k_t^T k_t) Diag(exp(g_t)) S_{t-1} + beta_t k_t^T v_t``. With a per-head
decay (g the same in every channel) this is the gated delta rule of :mod:`laquant.kernels.delta`.
Arithmetic in float32 (float64 for float64 inputs); the output is cast back to ``v.dtype``.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..delta.reference import prepare_inputs


def recurrent_kda_step(q, k, v, g, beta, state, scale: float | None = None):
    """One decode step on prepared (float, head-matched) inputs: q, k, g ``[B, H, K]``, v ``[B, H, V]``,
    beta ``[B, H]``, state ``[B, H, K, V]``. Returns ``(o [B, H, V], new_state)``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    state = state * g.exp().unsqueeze(-1)
    delta = (v - torch.einsum("bhk,bhkv->bhv", k, state)) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return torch.einsum("bhk,bhkv->bhv", q * scale, state), state


def recurrent_kda(q, k, v, g, beta, scale: float | None = None, initial_state: torch.Tensor | None = None,
                  output_final_state: bool = False, use_qk_l2norm: bool = False):
    """Token by token. Returns ``(o [B, T, Hv, V], final state or None)``."""
    out_dtype = v.dtype
    q, k, v, g, beta = prepare_inputs(q, k, v, g, beta, use_qk_l2norm, per_channel=True)
    B, T, H, K = q.shape
    state = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(q.dtype)
    out = []
    for t in range(T):
        o_t, state = recurrent_kda_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state, scale)
        out.append(o_t)
    o = torch.stack(out, 1) if out else v.new_zeros(B, 0, H, v.shape[-1])
    return o.to(out_dtype), (state if output_final_state else None)


def chunk_kda(q, k, v, g, beta, scale: float | None = None, initial_state: torch.Tensor | None = None,
              output_final_state: bool = False, use_qk_l2norm: bool = False, chunk_size: int = 64,
              state_roundtrip: Callable[[torch.Tensor], torch.Tensor] | None = None):
    """Chunked form (the WY / UT-transform representation, as fla's ``chunk_kda``). Inside a chunk,
    with ``G`` the cumulative log-decay per channel and ``D_ijc = exp(G_ic - G_jc)`` (``j <= i``,
    never overflowing), the delta updates are the unit-lower-triangular system
    ``(I + A)``, ``A_ij = beta_i sum_c k_ic k_jc D_ijc`` (``j < i``); its solutions
    ``u = (I + A)^-1 (beta v)`` and ``w = (I + A)^-1 (beta exp(G) k)`` give the values written,
    ``v_new = u - w S``. Between chunks the state is carried, passing through ``state_roundtrip``
    after every chunk but the last. Same arguments and returns as :func:`recurrent_kda`."""
    out_dtype = v.dtype
    q, k, v, g, beta = prepare_inputs(q, k, v, g, beta, use_qk_l2norm, per_channel=True)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    scale = K ** -0.5 if scale is None else scale
    n = -(-T // C)
    pad = n * C - T

    def chunks(x):  # [B, T, H, ...] -> [B, H, n, C, ...]; zero padding adds nothing (beta = 0, g = 0)
        x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 3) + (0, 0, 0, pad))
        return x.reshape(B, n, C, H, *x.shape[3:]).transpose(1, 3).transpose(2, 3)

    q, k, v, G = chunks(q) * scale, chunks(k), chunks(v), chunks(g).cumsum(-2)  # G [B, H, n, C, K]
    beta = chunks(beta.unsqueeze(-1)).squeeze(-1)
    state = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(q.dtype)
    out = []
    for i in range(n):  # one chunk at a time: the [C, C, K] decay tensor of all chunks would not fit
        qi, ki, vi, Gi, bi = q[:, :, i], k[:, :, i], v[:, :, i], G[:, :, i], beta[:, :, i]
        attn, u, w = intra_chunk(qi, ki, vi, Gi, bi)
        v_new = u - w @ state
        out.append((qi * Gi.exp()) @ state + attn @ v_new)
        g_last = Gi[..., -1, :]  # [B, H, K]
        state = state * g_last.exp().unsqueeze(-1) + (ki * (g_last.unsqueeze(-2) - Gi).exp()).transpose(-1, -2) @ v_new
        if state_roundtrip is not None and i + 1 < n:
            state = state_roundtrip(state)
    o = torch.stack(out, 2).permute(0, 2, 3, 1, 4).reshape(B, n * C, H, V)[:, :T] if n else v.new_zeros(B, 0, H, V)
    return o.to(out_dtype), (state if output_final_state else None)


def intra_chunk(q, k, v, G, beta):
    """A chunk's own quantities in the WY form (see :func:`chunk_kda`): q (scaled), k, ``G`` (the cumulative
    log-decay) ``[..., C, K]``, v ``[..., C, V]``, beta ``[..., C]``. Returns ``(attn [..., C, C], u, w)``: the
    causal ``q k^T * D``, ``(I + A)^-1 (beta v)`` and ``(I + A)^-1 (beta exp(G) k)``."""
    C = q.shape[-2]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = (G.unsqueeze(-2) - G.unsqueeze(-3)).masked_fill(~causal[..., None], 0.0)  # G_i - G_j, j <= i
    kd = k.unsqueeze(-3) * diff.exp()  # [..., C(i), C(j), K]: k_j exp(G_i - G_j)
    system = torch.einsum("...ik,...ijk->...ij", k, kd) * beta.unsqueeze(-1)
    system = system.masked_fill(~causal.tril(-1), 0.0) + torch.eye(C, dtype=q.dtype, device=q.device)
    attn = torch.einsum("...ik,...ijk->...ij", q, kd).masked_fill(~causal, 0.0)
    u = torch.linalg.solve_triangular(system, v * beta.unsqueeze(-1), upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k * beta.unsqueeze(-1) * G.exp(), upper=False, unitriangular=True)
    return attn, u, w


def intra_chunk_rows(q, k, v, g, beta, scale: float | None = None, use_qk_l2norm: bool = False,
                     chunk_size: int = 16):
    """:func:`intra_chunk` of every chunk, laid out as the intra-chunk kernel writes it: each token's row,
    ``(qk [B, T, Hv, chunk_size], w [B, T, Hv, K], u [B, T, Hv, V])`` in float32. Arguments as
    :func:`chunk_kda`."""
    q, k, v, g, beta = prepare_inputs(q, k, v, g, beta, use_qk_l2norm, per_channel=True)
    B, T, H, K = q.shape
    C = chunk_size
    n = -(-T // C)
    pad = n * C - T

    def chunks(x):  # [B, T, H, ...] -> [B, H, n, C, ...]
        x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 3) + (0, 0, 0, pad))
        return x.reshape(B, n, C, H, *x.shape[3:]).transpose(1, 3).transpose(2, 3)

    def rows(x):  # [B, H, n, C, ...] -> [B, T, H, ...]
        return x.transpose(2, 3).transpose(1, 3).reshape(B, n * C, H, *x.shape[4:])[:, :T]

    scale = K ** -0.5 if scale is None else scale
    attn, u, w = intra_chunk(chunks(q) * scale, chunks(k), chunks(v), chunks(g).cumsum(-2),
                             chunks(beta.unsqueeze(-1)).squeeze(-1))
    return rows(attn), rows(w), rows(u)
