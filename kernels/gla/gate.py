"""GLA's gate tail: logits -> per-channel log-decay, in one pass.

Spec (:func:`gate_log_decay`, also the CPU path): the calibrated gate treatment of an int8 gate
(clamp the logits of each channel to its calibrated ``[logit_min, logit_max]``, round them to
int8 with the channel's static scale, back to the logits' dtype), then fla's
``logsigmoid(logits) / normalizer``, optionally clamped below at ``clamp_min``. The Triton kernel
does the same elementwise chain in one launch (PyTorch takes about a dozen).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.numerics import fake_quantize_int8

try:
    import triton
    import triton.language as tl

    from ..common.triton_numerics import quantize_int8 as tl_quantize_int8
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def gate_log_decay(logits: torch.Tensor, normalizer: float, clamp_min: float | None = None,
                   logit_min: torch.Tensor | None = None, logit_max: torch.Tensor | None = None,
                   logit_scale: torch.Tensor | None = None) -> torch.Tensor:
    """float32 log-decay ``<= 0`` from gate logits ``[..., C]``; with ``logit_scale`` the logits are
    clamped to their calibrated ``[logit_min, logit_max]`` (when given) and fake-quantized first
    (:func:`~..common.numerics.fake_quantize_int8`)."""
    if logit_scale is not None:
        logits = fake_quantize_int8(logits, logit_scale, logit_min, logit_max)
    gk = F.logsigmoid(logits.float()) / normalizer
    return gk.clamp_min(clamp_min) if clamp_min is not None else gk


if triton is not None:

    @triton.jit
    def _gate_log_decay_kernel(x_ptr, lo_ptr, hi_ptr, s_ptr, y_ptr, M, C, s_xm, normalizer, clamp_min,
                               BLOCK_C: tl.constexpr, ROWS: tl.constexpr, QUANT: tl.constexpr, BOUNDS: tl.constexpr,
                               PER_CHANNEL: tl.constexpr, CLAMP_MIN: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mc = cols < C
        mask = (rows < M)[:, None] & mc[None, :]
        raw = tl.load(x_ptr + rows.to(tl.int64)[:, None] * s_xm + cols[None, :], mask=mask, other=0.0)
        x = raw.to(tl.float32)  # exact; the bounds and the dequantized logits are rounded to raw's dtype
        if QUANT:
            if BOUNDS:
                lo = tl.load(lo_ptr + cols, mask=mc, other=0.0).to(raw.dtype).to(tl.float32)
                hi = tl.load(hi_ptr + cols, mask=mc, other=0.0).to(raw.dtype).to(tl.float32)
                x = tl.maximum(tl.minimum(x, hi[None, :]), lo[None, :])
            if PER_CHANNEL:
                s = tl.load(s_ptr + cols, mask=mc, other=1.0)[None, :]
            else:
                s = tl.load(s_ptr)
            x = (tl_quantize_int8(x, s).to(tl.float32) * s).to(raw.dtype).to(tl.float32)
        y = (tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))) / normalizer  # logsigmoid
        if CLAMP_MIN:
            y = tl.maximum(y, clamp_min)
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * C + cols[None, :], y, mask=mask)


def gate_log_decay_triton(logits: torch.Tensor, normalizer: float, clamp_min: float | None = None,
                          logit_min: torch.Tensor | None = None, logit_max: torch.Tensor | None = None,
                          logit_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of :func:`gate_log_decay`; ``logits [..., C]`` with rows of one stride."""
    C = logits.shape[-1]
    x = logits.reshape(-1, C)
    if x.stride(-1) != 1:
        x = x.contiguous()
    M = x.shape[0]
    y = torch.empty(*logits.shape[:-1], C, dtype=torch.float32, device=logits.device)
    if M and C:
        quant = logit_scale is not None
        bounds = quant and logit_min is not None
        block_c = min(1024, triton.next_power_of_2(C))
        rows = max(1, 2048 // block_c)
        dummy = y
        _gate_log_decay_kernel[(triton.cdiv(M, rows), triton.cdiv(C, block_c))](
            x, logit_min if bounds else dummy, logit_max if bounds else dummy, logit_scale if quant else dummy, y,
            M, C, x.stride(0), float(normalizer), 0.0 if clamp_min is None else clamp_min,
            BLOCK_C=block_c, ROWS=rows, QUANT=quant, BOUNDS=bounds,
            PER_CHANNEL=quant and logit_scale.numel() > 1, CLAMP_MIN=clamp_min is not None, num_warps=4)
    return y
