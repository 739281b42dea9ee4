"""Reference for the int8 GEMM with an LLM.int8-style outlier split (the spec for the Triton kernel).

``y = dequant(int8(x[:, keep]) @ W_int8^T) + x[:, outliers] @ W_outliers^T (+ bias)``

The activation is quantized per token (or per tensor, or per token and group of 128 columns) with dynamic
absmax scales, the weight per output channel (or per tensor). The int8 x int8 products are summed exactly
(int32 semantics; the reference uses float64, exact for any realistic K), then scaled by the row and column
scales.
"""

from __future__ import annotations

import torch

from ..common.numerics import ACT_GROUP, dequantize, quantize_int8, quantize_int8_groups


# int32 sums of int8 products stay exact up to this many terms (127 * 127 per product)
_INT32_EXACT_K = (2**31 - 1) // (127 * 127)


def int8_matmul_exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [M, K] int8 @ b [N, K]^T int8`` summed exactly, returned as float32 (int32 values).

    On the CPU through ``torch._int_mm`` (int32 accumulation: exact, and 10-100x faster than the
    float64 emulation); elsewhere, or where it does not apply, in float64 (exact for any realistic
    K). Both give the same integers, so the same float32 result."""
    if a.device.type == "cpu" and a.shape[-1] <= _INT32_EXACT_K and hasattr(torch, "_int_mm"):
        try:
            return torch._int_mm(a.contiguous(), b.t()).float()
        except RuntimeError:  # a layout or shape this build's kernel refuses
            pass
    return int8_matmul_float64(a, b)


def int8_matmul_float64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The float64 emulation of :func:`int8_matmul_exact` (exact below 2**53 per sum)."""
    return (a.double() @ b.double().T).float()


def int8_outlier_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    keep_idx: torch.Tensor | None,
    outlier_idx: torch.Tensor | None,
    outlier_weight: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    act_granularity: str = "per_token",
) -> torch.Tensor:
    """x ``[..., in]`` -> ``[..., out]`` in x's dtype; weight_scale ``[out, 1]`` or ``[1, 1]``.

    ``act_granularity``: ``per_token`` / ``per_tensor`` (dynamic int8 activations), ``per_group`` (dynamic,
    one scale per token and group of :data:`ACT_GROUP` consecutive columns of ``qweight``: each group's exact int32
    sums times its scale, summed over the groups in order in float32), or ``none`` (weight-only: the activation
    stays in float and meets the dequantized weight). Under ``per_group`` the int8 weight spans the outlier columns
    too (zero there, ``keep_idx`` all columns), so that its groups are the input's; the outlier columns are zeroed in
    the activation before the groups' absmax, as the per-token form leaves them out of the token's.
    """
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    src = x2  # the columns the int8 product reads (x2 itself stays for the outlier product)
    if act_granularity == "per_group" and outlier_idx is not None and outlier_idx.numel():
        src = x2.clone()
        src[:, outlier_idx] = 0
    main = src if keep_idx is None else src.index_select(1, keep_idx)
    if act_granularity == "none":
        y = main.float() @ dequantize(qweight, weight_scale).T
    elif act_granularity == "per_group":
        qx, x_scale = quantize_int8_groups(main)
        y = torch.zeros(qx.shape[0], qweight.shape[0], dtype=torch.float32, device=x.device)
        for g in range(x_scale.shape[1]):
            cols = slice(g * ACT_GROUP, (g + 1) * ACT_GROUP)
            y += int8_matmul_exact(qx[:, cols], qweight[:, cols]) * x_scale[:, g:g + 1]
        y = y * weight_scale.view(1, -1)
    else:
        qx, x_scale = quantize_int8(main, dim=-1 if act_granularity == "per_token" else None)
        y = int8_matmul_exact(qx, qweight) * x_scale * weight_scale.view(1, -1)
    if outlier_idx is not None and outlier_idx.numel():
        y = y + x2.index_select(1, outlier_idx).float() @ outlier_weight.float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*shape[:-1], -1)
