"""Reference for a MoE layer's routed experts with int8 weights (the spec for :mod:`.grouped`).

transformers holds a layer's experts as 3-D weights: ``gate_up_proj [E, 2I, H]`` (the gate's rows, then the up
projection's) or ``up_proj [E, I, H]`` for experts without a gate, and ``down_proj [E, H, I]``. Here each is int8
codes with a float32 scale per expert and output channel (weight-only: the tokens are not quantized; at decode
sizes the experts are bound by their weights' bytes, which int8 halves).

For each token ``t`` and each of its ``k`` experts ``e`` (routing weight ``w``):

``h = (x[t] @ codes_in[e]^T) * scale_in[e]`` in float32;
``a = act(h[:I]) * h[I:]`` (gated) or ``act(h)``, in float32, rounded to x's dtype; with a SwiGLU ``limit``
(Ling / Ring's experts) ``min(act(h[:I]), limit) * clamp(h[I:], -limit, limit)``;
``y = (a @ codes_out[e]^T) * scale_out[e] * w`` in float32;
``out[t] = sum over the token's k experts of y``, in float32, rounded to x's dtype.

The products' sums are float32 (the GPU kernel sums its tiles in another order: equal to the rounding of float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# transformers' expert activations that the kernels implement, by laquant's name
ACTIVATIONS = ("silu", "relu2")


def activate(h: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "silu":
        return F.silu(h)
    if activation == "relu2":
        return F.relu(h).square()
    raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")


def check_experts(x, top_k_index, top_k_weights, in_codes, in_scale, out_codes, out_scale, activation: str,
                  gated: bool) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    if x.dim() != 2 or top_k_index.dim() != 2 or top_k_weights.shape != top_k_index.shape:
        raise ValueError(f"expected x [T, H], top_k_index and top_k_weights [T, k]; got {tuple(x.shape)}, "
                         f"{tuple(top_k_index.shape)}, {tuple(top_k_weights.shape)}")
    E, n_in, H = in_codes.shape
    I = n_in // 2 if gated else n_in
    if (x.shape[1] != H or top_k_index.shape[0] != x.shape[0] or out_codes.shape != (E, H, I)
            or (gated and n_in % 2) or in_scale.shape != (E, n_in) or out_scale.shape != (E, H)):
        raise ValueError(f"experts do not fit x {tuple(x.shape)}: in {tuple(in_codes.shape)} (gated={gated}), "
                         f"scale {tuple(in_scale.shape)}, out {tuple(out_codes.shape)}, scale {tuple(out_scale.shape)}")
    if in_codes.dtype != torch.int8 or out_codes.dtype != torch.int8:
        raise ValueError("expert weights must be int8 codes")


def gate(h: torch.Tensor, activation: str, gated: bool, limit: float | None = None) -> torch.Tensor:
    """The experts' activation of their input projection's output ``h [.., 2I or I]``."""
    if not gated:
        return activate(h, activation)
    g, u = h.chunk(2, dim=-1)
    g = activate(g, activation)
    if limit is not None:
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return g * u


def int8_experts(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, in_codes: torch.Tensor,
                 in_scale: torch.Tensor, out_codes: torch.Tensor, out_scale: torch.Tensor, activation: str,
                 gated: bool, limit: float | None = None) -> torch.Tensor:
    """``out [T, H]`` in x's dtype for ``x [T, H]`` routed to ``top_k_index [T, k]`` with ``top_k_weights [T, k]``;
    ``in_codes [E, 2I or I, H]`` / ``out_codes [E, H, I]`` int8 with float32 ``in_scale [E, 2I or I]`` /
    ``out_scale [E, H]``. Experts no token chose are not read."""
    check_experts(x, top_k_index, top_k_weights, in_codes, in_scale, out_codes, out_scale, activation, gated)
    T, k = top_k_index.shape
    pair_out = torch.zeros(T * k, x.shape[1], dtype=torch.float32, device=x.device)
    expert_of_pair = top_k_index.reshape(-1)
    weight_of_pair = top_k_weights.reshape(-1).float()
    for e in expert_of_pair.unique().tolist():
        pairs = (expert_of_pair == e).nonzero().flatten()
        h = (x[pairs // k].float() @ in_codes[e].float().T) * in_scale[e]
        a = gate(h, activation, gated, limit)
        y = (a.to(x.dtype).float() @ out_codes[e].float().T) * out_scale[e]
        pair_out[pairs] = y * weight_of_pair[pairs, None]
    return pair_out.view(T, k, x.shape[1]).sum(1).to(x.dtype)
