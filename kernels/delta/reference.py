"""Plain-PyTorch reference for the gated delta rule (Gated DeltaNet, Qwen3-Next's linear attention).

Layout as fla and transformers: q, k ``[B, T, Hk, K]``, v ``[B, T, Hv, V]``, g (log-decay, ``<= 0``)
and beta ``[B, T, Hv]``, state ``[B, Hv, K, V]``; each q/k head serves ``Hv // Hk`` consecutive value
heads. With ``S`` the state and ``scale = K ** -0.5``::

    S_t = exp(g_t) S_{t-1}
    S_t = S_t + k_t^T (beta_t (v_t - k_t S_t))            (the delta rule: write only the correction)
    o_t = (scale * q_t) S_t

Unlike GLA, the update reads the state (``k_t S_t``), so state-quantization error feeds back into
what is written; the same state formats apply (``state_roundtrip`` as in :func:`chunk_gla`).
Arithmetic in float32 (float64 for float64 inputs); the output is cast back to ``v.dtype``.
"""

from __future__ import annotations

from typing import Callable

import torch


def prepare_inputs(q, k, v, g, beta, use_qk_l2norm: bool, per_channel: bool = False):
    """Shape-checked float inputs with q/k heads matched to the value heads (and l2-normalised);
    g ``[B, T, Hv]`` per head, or with ``per_channel`` ``[B, T, Hv, K]`` (KDA's)."""
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"q, k must be [B, T, Hk, K] and v [B, T, Hv, V]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    hk, hv = q.shape[2], v.shape[2]
    g_shape = (*v.shape[:3], q.shape[3]) if per_channel else v.shape[:3]
    if hv % hk or g.shape != g_shape or beta.shape != v.shape[:3]:
        want = "g [B, T, Hv, K] and beta [B, T, Hv]" if per_channel else "g, beta [B, T, Hv]"
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({hk}), and {want}; "
                         f"got g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, g, beta = (x.to(acc) for x in (q, k, v, g, beta))
    if hv != hk:
        q, k = (x.repeat_interleave(hv // hk, dim=2) for x in (q, k))
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    return q, k, v, g, beta


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """As fla and transformers normalise q and k: ``x * rsqrt(sum(x^2) + 1e-6)`` over the last dim."""
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + 1e-6)


def recurrent_gated_delta_rule_step(q, k, v, g, beta, state, scale: float | None = None):
    """One decode step on prepared (float, head-matched) inputs: q, k ``[B, H, K]``, v ``[B, H, V]``,
    g, beta ``[B, H]``, state ``[B, H, K, V]``. Returns ``(o [B, H, V], new_state)``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    state = state * g.exp()[..., None, None]
    delta = (v - torch.einsum("bhk,bhkv->bhv", k, state)) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return torch.einsum("bhk,bhkv->bhv", q * scale, state), state


def recurrent_gated_delta_rule(q, k, v, g, beta, scale: float | None = None,
                               initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                               use_qk_l2norm: bool = False):
    """Token by token. Returns ``(o [B, T, Hv, V], final state or None)``."""
    out_dtype = v.dtype
    q, k, v, g, beta = prepare_inputs(q, k, v, g, beta, use_qk_l2norm)
    B, T, H, K = q.shape
    state = (q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(q.dtype))
    out = []
    for t in range(T):
        o_t, state = recurrent_gated_delta_rule_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state, scale)
        out.append(o_t)
    o = torch.stack(out, 1) if out else v.new_zeros(B, 0, H, v.shape[-1])
    return o.to(out_dtype), (state if output_final_state else None)


def chunk_gated_delta_rule(q, k, v, g, beta, scale: float | None = None, initial_state: torch.Tensor | None = None,
                           output_final_state: bool = False, use_qk_l2norm: bool = False, chunk_size: int = 64,
                           state_roundtrip: Callable[[torch.Tensor], torch.Tensor] | None = None):
    """Chunked form (the WY / UT-transform representation, as fla's and transformers' chunked
    kernels): inside a chunk the delta updates are solved as one unit-lower-triangular system;
    between chunks the state is carried, passing through ``state_roundtrip`` after every chunk but
    the last (64 tokens by default, as the GLA path). Same arguments and returns as
    :func:`recurrent_gated_delta_rule`."""
    out_dtype = v.dtype
    q, k, v, g, beta = prepare_inputs(q, k, v, g, beta, use_qk_l2norm)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    scale = K ** -0.5 if scale is None else scale
    n = -(-T // C)
    pad = n * C - T

    def chunks(x):  # [B, T, H, ...] -> [B, H, n, C, ...]; zero padding adds nothing (beta = 0, g = 0)
        x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 3) + (0, 0, 0, pad))
        return x.reshape(B, n, C, H, *x.shape[3:]).transpose(1, 3).transpose(2, 3)

    q, k, v = chunks(q) * scale, chunks(k), chunks(v)
    g, beta = chunks(g.unsqueeze(-1)).squeeze(-1), chunks(beta.unsqueeze(-1)).squeeze(-1)
    b = g.cumsum(-1)  # [B, H, n, C]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()  # exp(b_i - b_j), j <= i
    k_beta, v_beta = k * beta.unsqueeze(-1), v * beta.unsqueeze(-1)
    # (I + strictly-lower(beta_i k_i . k_j decay_ij)) is the system whose solution gives, per chunk, the
    # values written (u) and the decayed keys that read the incoming state (w)
    system = (k_beta @ k.transpose(-1, -2)) * decay
    system = system.tril(-1) + torch.eye(C, dtype=q.dtype, device=q.device)
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * b.exp().unsqueeze(-1), upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay
    q_from_start = q * b.exp().unsqueeze(-1)
    k_to_end = k * (b[..., -1:] - b).exp().unsqueeze(-1)
    chunk_decay = b[..., -1].exp()[..., None, None]
    state = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(q.dtype)
    out = []
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ state
        out.append(q_from_start[:, :, i] @ state + attn[:, :, i] @ v_new)
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ v_new
        if state_roundtrip is not None and i + 1 < n:
            state = state_roundtrip(state)
    o = torch.stack(out, 2).permute(0, 2, 3, 1, 4).reshape(B, n * C, H, V)[:, :T] if n else v.new_zeros(B, 0, H, V)
    return o.to(out_dtype), (state if output_final_state else None)
