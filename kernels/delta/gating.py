"""The gated delta rule's gate tail in one launch (vLLM's ``fused_gdn_gating`` for Qwen3-Next):
decay logits ``a`` and beta logits ``b`` -> ``g = -exp(A_log) * softplus(a + dt_bias)`` and
``beta = sigmoid(b) * beta_scale``, both float32. Where a logit comes from a calibrated gate
(:class:`~laquant.quant.modules.QuantGate`), its treatment comes first, in the logits' dtype: clamped
to ``[logit_min, logit_max]``, int8 with the channel's static scale and back
(:func:`~..common.numerics.fake_quantize_int8`).

Spec: :func:`gdn_gating` (also the CPU path). In PyTorch the tail of a decode step is about fifteen
launches per layer (the treatment, splitting the fused ``in_proj_ba``, the softplus chain, the
sigmoid); the kernel reads the logits where the projection wrote them: ``a`` and ``b`` are
``[..., G, R]`` views (qwen3_next's ``in_proj_ba`` holds, per key head, ``R`` beta then ``R`` decay
logits) of any strides, and so are their treatments' ``[G, R]`` parameters.

Kimi Delta Attention's forget gate has the same tail per key channel: its decay logits ``[..., H, K]`` (the
low-rank ``f_b_proj``'s output, ``G = H`` heads of ``R = K`` channels), ``dt_bias`` per channel and ``A_log``
per head (per group, ``[G]``); it has no beta in this launch (``b`` None: its ``b_proj`` is another projection,
on the layer's main stream while the decay runs beside it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.gate_treatment import treated, treatment_args
from ..common.launch import launch_kernel
from ..common.pdl import pdl_launch
from ..common.sizes import cdiv, next_power_of_2

try:
    import triton
    import triton.language as tl

    from ..common.pdl import pdl_prologue
    from ..common.triton_numerics import load_treated_logits
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def gdn_gating(a: torch.Tensor, b: torch.Tensor | None, A_log: torch.Tensor, dt_bias: torch.Tensor,
               beta_scale: float = 1.0, a_treatment: dict | None = None, b_treatment: dict | None = None):
    """``(g, beta)`` ``[..., G * R]`` float32 from ``a, b [..., G, R]`` (``dt_bias`` ``[G * R]``, ``A_log``
    ``[G * R]`` or one per group ``[G]``; ``b`` None: beta None). A treatment is
    :meth:`QuantGate.logit_treatment`'s dict with its tensors as ``[G, R]`` views (the scale may be one element:
    per-tensor), or None."""
    G, R = a.shape[-2:]
    _check_rates(A_log, dt_bias, G, R)
    rate = A_log.float().exp().reshape(-1)
    rate = rate.reshape(G, 1).expand(G, R).flatten() if rate.numel() == G and R > 1 else rate
    g = -rate * F.softplus(treated(a, a_treatment).flatten(-2).float() + dt_bias.float())
    if b is None:
        if b_treatment is not None:
            raise ValueError("a treatment of the beta logits was given without them")
        return g, None
    beta = treated(b, b_treatment).flatten(-2).float().sigmoid()
    return g, beta * beta_scale if beta_scale != 1.0 else beta


def _check_rates(A_log: torch.Tensor, dt_bias: torch.Tensor, G: int, R: int) -> None:
    if A_log.numel() not in (G, G * R) or dt_bias.numel() != G * R:
        raise ValueError(f"A_log must hold one value per group ({G}) or per channel ({G * R}) and dt_bias one per "
                         f"channel; got {A_log.numel()} and {dt_bias.numel()}")


if triton is not None:

    @triton.jit
    def _gdn_gating_kernel(a_ptr, b_ptr, alog_ptr, dtb_ptr, g_ptr, beta_ptr, a_lo, a_hi, a_s, b_lo, b_hi, b_s, M,
                           s_am, s_ag, s_ar, s_bm, s_bg, s_br, p_ag, p_ar, p_bg, p_br, beta_scale,
                           H: tl.constexpr, R: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr,
                           A_QUANT: tl.constexpr, A_BOUNDS: tl.constexpr, A_PER_CHANNEL: tl.constexpr,
                           B_QUANT: tl.constexpr, B_BOUNDS: tl.constexpr, B_PER_CHANNEL: tl.constexpr,
                           HAS_B: tl.constexpr, ALOG_PER_GROUP: tl.constexpr, PDL: tl.constexpr):
        pdl_prologue(PDL)
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        h = tl.arange(0, BLOCK_H)
        mask = (rows < M)[:, None] & (h < H)[None, :]
        grp, r = h // R, h % R
        rows64 = rows.to(tl.int64)[:, None]
        a = load_treated_logits(a_ptr, a_lo, a_hi, a_s, rows64 * s_am + (grp * s_ag + r * s_ar)[None, :],
                                (grp * p_ag + r * p_ar)[None, :], mask, A_QUANT, A_BOUNDS, A_PER_CHANNEL)
        x = a + tl.load(dtb_ptr + h, mask=h < H, other=0.0).to(tl.float32)[None, :]
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's (beta 1, threshold 20)
        alog = tl.load(alog_ptr + (grp if ALOG_PER_GROUP else h), mask=h < H, other=0.0).to(tl.float32)
        g = -tl.exp(alog)[None, :] * softplus
        out = rows64 * H + h[None, :]
        tl.store(g_ptr + out, g, mask=mask)
        if HAS_B:
            b = load_treated_logits(b_ptr, b_lo, b_hi, b_s, rows64 * s_bm + (grp * s_bg + r * s_br)[None, :],
                                    (grp * p_bg + r * p_br)[None, :], mask, B_QUANT, B_BOUNDS, B_PER_CHANNEL)
            beta = 1.0 / (1.0 + tl.exp(-b)) * beta_scale
            tl.store(beta_ptr + out, beta, mask=mask)


def gdn_gating_triton(a: torch.Tensor, b: torch.Tensor | None, A_log: torch.Tensor, dt_bias: torch.Tensor,
                      beta_scale: float = 1.0, a_treatment: dict | None = None, b_treatment: dict | None = None):
    """Twin of :func:`gdn_gating`, one launch."""
    if a.dim() < 2 or (b is not None and a.shape != b.shape):
        raise ValueError(f"expected a and b of one shape [..., G, R]; got {tuple(a.shape)} and "
                         f"{None if b is None else tuple(b.shape)}")
    if b is None and b_treatment is not None:
        raise ValueError("a treatment of the beta logits was given without them")
    G, R = a.shape[-2:]
    H = G * R
    _check_rates(A_log, dt_bias, G, R)
    lead = a.shape[:-2]
    a3 = a.reshape(-1, G, R)  # a view where the leading dims have one stride
    b3 = b.reshape(-1, G, R) if b is not None else a3
    M = a3.shape[0]
    g = torch.empty(*lead, H, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g) if b is not None else None
    if M and H:
        (alo, ahi, a_s), (p_ag, p_ar), aq = treatment_args(a_treatment, g, G, R)
        (blo, bhi, b_s), (p_bg, p_br), bq = treatment_args(b_treatment, g, G, R)
        block_h = next_power_of_2(H)
        rows = max(1, min(64, 2048 // block_h))
        launch_kernel(_gdn_gating_kernel, (cdiv(M, rows),),
            a3, b3, A_log, dt_bias, g, beta if beta is not None else g, alo, ahi, a_s, blo, bhi, b_s, M,
            *a3.stride(), *b3.stride(), p_ag, p_ar, p_bg, p_br, float(beta_scale), H=H, R=R, ROWS=rows,
            BLOCK_H=block_h, **{f"A_{k}": v for k, v in aq.items()}, **{f"B_{k}": v for k, v in bq.items()},
            HAS_B=b is not None, ALOG_PER_GROUP=A_log.numel() != H, num_warps=4, **pdl_launch(a.device, M))
    return g, beta
