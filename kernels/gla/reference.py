"""Plain-PyTorch reference for gated linear attention (GLA): the spec every kernel meets.

Layout (fla's): q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, g ``[B, T, H, K]`` the per-channel
log-decay (``<= 0``), state ``[B, H, K, V]``. With ``h_0`` the initial state::

    h_t = diag(exp(g_t)) h_{t-1} + k_t^T v_t          (state recurrence)
    o_t = (scale * q_t) h_t                           (readout)

A scalar per-head decay (Lightning attention, Mamba2-style SSD) is the special case where ``g``
is the same for every K channel: pass it broadcast to ``[B, T, H, K]``.

Arithmetic runs in float32 (float64 when the inputs are float64) whatever the input dtype; the
output is cast back to ``v.dtype`` and the final state is float32/float64. Every exponent taken is
a difference ``b_i - b_j`` with ``i >= j`` of cumulative log-decays, so it is non-positive and
nothing overflows, however strong the decay.
"""

from __future__ import annotations

from typing import Callable

import torch


def _acc_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_shapes(q, k, v, g, initial_state):
    if q.dim() != 4 or k.shape != q.shape or g.shape != q.shape:
        raise ValueError(
            f"q, k and g must all be [B, T, H, K]; got q {tuple(q.shape)}, k {tuple(k.shape)}, g {tuple(g.shape)}"
        )
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, T, H, V] with B, T, H of q {tuple(q.shape)}; got {tuple(v.shape)}")
    if initial_state is not None:
        B, _, H, K = q.shape
        expected = (B, H, K, v.shape[-1])
        if tuple(initial_state.shape) != expected:
            raise ValueError(f"initial_state must be [B, H, K, V] = {expected}; got {tuple(initial_state.shape)}")


def recurrent_gla_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, state: torch.Tensor,
                       scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step. q, k, g ``[B, H, K]``, v ``[B, H, V]``, state ``[B, H, K, V]`` (float32).

    Returns ``(o [B, H, V] in v.dtype, new_state [B, H, K, V] in the accumulator dtype)``.
    """
    acc = _acc_dtype(q, state)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out_dtype = v.dtype
    q, k, v, g = (x.to(acc) for x in (q, k, v, g))
    state = state.to(acc) * g.exp().unsqueeze(-1) + k.unsqueeze(-1) * v.unsqueeze(-2)
    o = torch.einsum("bhk,bhkv->bhv", q * scale, state)
    return o.to(out_dtype), state


def recurrent_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float | None = None,
                  initial_state: torch.Tensor | None = None,
                  output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token form: a loop of :func:`recurrent_gla_step`. Same signature as :func:`chunk_gla`."""
    _check_shapes(q, k, v, g, initial_state)
    B, T, H, K = q.shape
    acc = _acc_dtype(q, k, v, g)
    state = q.new_zeros(B, H, K, v.shape[-1], dtype=acc) if initial_state is None else initial_state.to(acc)
    out = []
    for t in range(T):
        o_t, state = recurrent_gla_step(q[:, t], k[:, t], v[:, t].to(acc), g[:, t], state, scale)
        out.append(o_t)
    o = torch.stack(out, dim=1).to(v.dtype)
    return o, (state if output_final_state else None)


def chunk_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float | None = None,
              initial_state: torch.Tensor | None = None, output_final_state: bool = False, chunk_size: int = 16,
              state_roundtrip: Callable[[torch.Tensor], torch.Tensor] | None = None,
              roundtrip_every: int = 4) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked form: exact attention inside each chunk, the state carried between chunks.

    The intra-chunk part is vectorised over all chunks; only the state hand-over between chunks
    is a loop. Memory is ``O(B * H * T * chunk_size * K)``.

    ``state_roundtrip`` models a kernel that keeps the inter-chunk state in a storage format: the
    state passes through it (store, then load) every ``roundtrip_every`` chunks, as a kernel
    materialising its chunk states in memory would (4 x 16 = the 64-token chunks of fla's kernels).
    """
    _check_shapes(q, k, v, g, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    out_dtype = v.dtype
    acc = _acc_dtype(q, k, v, g)
    scale = K**-0.5 if scale is None else scale
    n_chunks = -(-T // C)
    pad = n_chunks * C - T

    def to_chunks(x: torch.Tensor) -> torch.Tensor:
        # zero padding is exact: g = 0 is "no decay", k = 0 adds nothing to the state.
        x = x.to(acc)
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
        return x.reshape(B, n_chunks, C, H, x.shape[-1]).permute(0, 3, 1, 2, 4)  # [B, H, N, C, D]

    q, k, v, g = to_chunks(q) * scale, to_chunks(k), to_chunks(v), to_chunks(g)
    b = g.cumsum(dim=-2)  # cumulative log-decay inside each chunk, non-increasing

    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = (b.unsqueeze(-2) - b.unsqueeze(-3)).masked_fill(~causal.unsqueeze(-1), float("-inf"))
    attn = torch.einsum("bhnik,bhnjk,bhnijk->bhnij", q, k, diff.exp())
    o = attn @ v

    q_from_start = q * b.exp()  # reads the state at the chunk's start
    k_to_end = k * (b[..., -1:, :] - b).exp()  # contributions decayed to the chunk's end
    chunk_decay = b[..., -1, :].exp()  # [B, H, N, K]
    state = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(acc)
    inter = []
    for n in range(n_chunks):
        inter.append(q_from_start[:, :, n] @ state)
        state = chunk_decay[:, :, n].unsqueeze(-1) * state + k_to_end[:, :, n].transpose(-1, -2) @ v[:, :, n]
        if state_roundtrip is not None and (n + 1) % roundtrip_every == 0 and n + 1 < n_chunks:
            state = state_roundtrip(state)
    o = o + torch.stack(inter, dim=2)

    o = o.permute(0, 2, 3, 1, 4).reshape(B, n_chunks * C, H, V)[:, :T]
    return o.to(out_dtype), (state if output_final_state else None)


def naive_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float | None = None,
              initial_state: torch.Tensor | None = None) -> torch.Tensor:
    """O(T^2) masked form, for tests: o_i = sum_{j<=i} (q_i * exp(B_i - B_j)) . k_j v_j + (q_i * exp(B_i)) h_0."""
    _check_shapes(q, k, v, g, initial_state)
    acc = _acc_dtype(q, k, v, g)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v, g = (x.to(acc) for x in (q, k, v, g))
    b = g.cumsum(dim=1)  # [B, T, H, K]
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    diff = (b.unsqueeze(2) - b.unsqueeze(1)).masked_fill(~causal[None, :, :, None, None], float("-inf"))
    attn = torch.einsum("bihk,bjhk,bijhk->bhij", q * scale, k, diff.exp())
    o = torch.einsum("bhij,bjhv->bihv", attn, v)
    if initial_state is not None:
        o = o + torch.einsum("bthk,bhkv->bthv", q * scale * b.exp(), initial_state.to(acc))
    return o


def noncausal_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               scale: float | None = None) -> torch.Tensor:
    """Bidirectional (encoder) linear attention: every token reads every token,
    ``o_i = scale * q_i (sum_j k_j^T v_j)``. q, k ``[B, T, H, K]``, v ``[B, T, H, V]``; float32
    arithmetic, output in ``v.dtype``. Cost is linear in T: one ``[K, V]`` summary per head."""
    _check_shapes(q, k, v, q, None)
    acc = _acc_dtype(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    kv = torch.einsum("bthk,bthv->bhkv", k.to(acc), v.to(acc))
    return torch.einsum("bthk,bhkv->bthv", q.to(acc) * scale, kv).to(v.dtype)
