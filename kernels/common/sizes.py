"""Launch arithmetic for the host side of the kernels: ``triton.cdiv`` and ``triton.next_power_of_2``
as plain Python, and the GPU's multiprocessor count. Since Triton 3.5 those two are ``constexpr_function``
objects whose every host call unwraps its arguments (~3 us a call on a CPU where a plain function takes
0.1 us); a 24-layer prefill makes ~1,200 of them. Kernels (``@triton.jit``) keep calling Triton's."""

from __future__ import annotations

import functools

import torch


def cdiv(x: int, y: int) -> int:
    """``ceil(x / y)`` for integers, as ``triton.cdiv``."""
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (0 for ``n <= 0``), as ``triton.next_power_of_2``."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def sm_count(device: torch.device, elsewhere: int = 1) -> int:
    """The streaming multiprocessors of a CUDA ``device`` (read once per device), ``elsewhere`` for any other
    device (the interpreter's launches on the CPU)."""
    return _cuda_sm_count(device) if device.type == "cuda" else elsewhere
