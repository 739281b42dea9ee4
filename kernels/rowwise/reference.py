"""Row-wise ops of a decoder layer, in plain PyTorch: the spec of :mod:`.fused` and the CPU path.

The roundings follow the unfused PyTorch modules they replace (fla's ``RMSNorm`` with the
residual add, ``FusedRMSNormGated`` with swish, ``silu(gate) * up``): statistics and products in
float32, one rounding to the input dtype where the unfused code rounds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GATE_ACTIVATIONS = ("silu", "sigmoid")  # a gated norm's gate activations


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             round_sum: bool = False, round_normed: bool = False):
    """``(rmsnorm(x + residual) * weight, x + residual)`` in x's dtype; the sum is None without a residual.
    The sum is normalized in float32 (fla's fused add-and-norm), or with ``round_sum`` as rounded to
    x's dtype (what a separate ``x + residual`` hands a norm). The weight multiplies in float32, after
    the normalized rows are rounded to x's dtype with ``round_normed`` (Llama's ``w * x.to(dtype)``)."""
    h = x.float() if residual is None else x.float() + residual.float()
    if round_sum and residual is not None:
        h = h.to(x.dtype).float()
    normed = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)
    if round_normed:
        normed = normed.to(x.dtype).float()
    out = (normed * weight.float()).to(x.dtype)
    return out, (None if residual is None else h.to(x.dtype))


def gated_rms_norm(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, eps: float, gate_first: bool = False,
                   round_normed: bool = False, activation: str = "silu") -> torch.Tensor:
    """``rmsnorm(x) * weight * silu(g)`` over the last dimension, in x's dtype (fla's); with ``gate_first``,
    Mamba2's ``rmsnorm(x * silu(g)) * weight`` (transformers' ``MambaRMSNormGated`` with x ``[..., groups, D]``
    and weight ``[groups, D]``: the normalized rows rounded to x's dtype before the weight with ``round_normed``,
    as its ``w * h.to(dtype)``). ``activation``: the gate's, ``silu`` or ``sigmoid`` (Kimi Delta Attention's
    output norm, ``rmsnorm(x) * weight * sigmoid(g)``)."""
    if activation not in GATE_ACTIVATIONS:
        raise ValueError(f"activation must be one of {GATE_ACTIVATIONS}; got {activation!r}")
    act = F.silu if activation == "silu" else torch.sigmoid
    h = x.float()
    if gate_first:
        h = h * act(g.float())
    h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)
    if round_normed:
        h = h.to(x.dtype).float()
    h = h * weight.float()
    return (h if gate_first else h * act(g.float())).to(x.dtype)


def glu(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """``act(gate) * up`` rounded as PyTorch's two ops round it (the activation's output, then the
    product); ``activation``: ``silu`` (SwiGLU) or ``sigmoid`` (a gated attention's output)."""
    if activation not in ("silu", "sigmoid"):
        raise ValueError(f"activation must be silu or sigmoid; got {activation!r}")
    return (F.silu(gate) if activation == "silu" else torch.sigmoid(gate)) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` rounded as PyTorch's two ops round it (silu's output, then the product)."""
    return glu(gate, up)
