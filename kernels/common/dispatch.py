"""Which implementation runs: the Triton kernels on CUDA, the PyTorch references elsewhere.

``LAQUANT_KERNELS=reference`` forces the references on CUDA too (to compare the two paths on one
device); a state format the kernels do not store (fp8_head, fp8_tensor, int4_row) also takes the reference,
and so does anything autograd must differentiate (the kernels are forward-only; training a model
with laquant's mixers, as ``tools/train.py`` does for the hybrid, runs the differentiable references).
"""

from __future__ import annotations

import torch

from .env import getenv
from .formats import KERNEL_FORMATS

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

_CHOICES = ("auto", "reference")


def kernel_choice() -> str:
    choice = getenv("LAQUANT_KERNELS", "auto")
    if choice not in _CHOICES:
        raise ValueError(f"LAQUANT_KERNELS must be one of {', '.join(_CHOICES)}; got {choice!r}")
    return choice


def use_triton(x: torch.Tensor, state_format: str | None = None) -> bool:
    """True when ``x`` lives on a CUDA device, Triton is there, the state format is a kernel's and no
    gradient is wanted through ``x``."""
    if not (x.is_cuda and HAS_TRITON and kernel_choice() == "auto"):
        return False
    if x.requires_grad and torch.is_grad_enabled():
        return False
    return state_format is None or state_format in KERNEL_FORMATS
