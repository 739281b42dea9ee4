"""A calibrated gate's treatment of its logits (:meth:`~laquant.quant.modules.QuantGate.logit_treatment`'s dict:
``logit_min`` / ``logit_max``, None without a clamp, and ``logit_scale``, one element or one per channel) as the
kernels that apply it take it: the PyTorch spec (:func:`treated`) and the launch arguments of a Triton kernel that
loads the logits through :func:`~.triton_numerics.load_treated_logits` (:func:`treatment_args`). The gated delta
rule's gate tail and the SSD (Mamba2) decode step apply it."""

from __future__ import annotations

import torch

from .numerics import fake_quantize_int8


def treated(x: torch.Tensor, treatment: dict | None) -> torch.Tensor:
    """``x`` clamped to the treatment's bounds and rounded through int8 (unchanged without a treatment)."""
    if treatment is None:
        return x
    return fake_quantize_int8(x, treatment["logit_scale"], treatment["logit_min"], treatment["logit_max"])


def treatment_args(treatment: dict | None, dummy: torch.Tensor, G: int, R: int):
    """(pointers lo, hi, scale), parameter strides (per group, per channel of a group) and the constexprs
    (``QUANT``, ``BOUNDS``, ``PER_CHANNEL``) of a treatment whose parameters are ``[G, R]`` views of one layout."""
    if treatment is None:
        return (dummy, dummy, dummy), (0, 0), dict(QUANT=False, BOUNDS=False, PER_CHANNEL=False)
    lo, hi, scale = treatment["logit_min"], treatment["logit_max"], treatment["logit_scale"]
    per_channel = scale.numel() > 1
    ref = scale if per_channel else lo
    strides = tuple(ref.stride()) if ref is not None and ref.dim() == 2 else (0, 0)
    for t in (lo, hi, scale if per_channel else None):
        if t is not None and (tuple(t.shape) != (G, R) or tuple(t.stride()) != strides):
            raise ValueError(f"a treatment's parameters must be [G, R] = [{G}, {R}] views of one layout; got "
                             f"{tuple(t.shape)} with strides {tuple(t.stride())}")
    return ((lo if lo is not None else dummy, hi if hi is not None else dummy, scale), strides,
            dict(QUANT=True, BOUNDS=lo is not None, PER_CHANNEL=per_channel))
