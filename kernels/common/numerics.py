"""The one quantize/dequantize implementation: modules, references and kernels all call these.

Symmetric absmax quantization: ``scale = absmax / qmax`` over the reduced dimension(s),
``q = clamp(round(x / scale), -qmax, qmax)`` (int8) or ``q = fp8(x / scale)`` (e4m3, round to
nearest even by the cast), ``x ~= q * scale``. Scales are float32; an all-zero slice gets scale
``tiny`` so dequantization returns exact zeros and nothing divides by zero.
"""

from __future__ import annotations

import torch

INT8_MAX = 127.0
FP8_E4M3_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
_TINY = torch.finfo(torch.float32).tiny


def absmax_scale(x: torch.Tensor, dim: int | tuple[int, ...] | None, qmax: float) -> torch.Tensor:
    """float32 scale with ``dim`` kept (``None``: one scale for the whole tensor)."""
    amax = x.detach().abs().float()
    amax = amax.amax() if dim is None else amax.amax(dim=dim, keepdim=True)
    return (amax / qmax).clamp_min(_TINY)


def quantize_int8(x: torch.Tensor, dim: int | tuple[int, ...] | None = -1,
                  scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 with absmax scales over ``dim`` (or the given ``scale``). Returns ``(q, scale)``."""
    scale = absmax_scale(x, dim, INT8_MAX) if scale is None else scale
    q = (x.float() / scale).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def quantize_fp8(x: torch.Tensor, dim: int | tuple[int, ...] | None = -1,
                 scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 with absmax scales over ``dim`` (or the given ``scale``). Returns ``(q, scale)``."""
    scale = absmax_scale(x, dim, FP8_E4M3_MAX) if scale is None else scale
    q = (x.float() / scale).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` in ``dtype`` (int8 or fp8 ``q``)."""
    return (q.float() * scale).to(dtype)


def fake_quantize_int8(x: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor | None = None,
                       hi: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` clamped to ``[lo, hi]`` (bounds rounded to x's dtype; none: no clamp), rounded to int8
    with the static ``scale`` and back to x's dtype (calibrated gate logits)."""
    if lo is not None:
        x = torch.maximum(torch.minimum(x, hi.to(x.dtype)), lo.to(x.dtype))
    q, scale = quantize_int8(x, scale=scale)
    return dequantize(q, scale, x.dtype)
