"""Which GPU's entry of a launch table a launch takes. The tables are keyed by CUDA device names (the GEMMs' tiles,
``gemm.configs.TABLES`` / ``GROUP_TABLES`` / ``STEP_TABLES``; the decode kernels' launches, ``state_io.DECODE_LAUNCH``
and ``STEP_DECODE_LAUNCH``), because what is fastest was measured on one GPU and differs on another.

Imports torch only inside :func:`device_name`: the lookups (and ``gemm.configs``) are testable anywhere."""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=None)
def device_name(device) -> str | None:
    """The name launch tables are keyed by (``torch.cuda.get_device_name`` of a ``torch.device``); None off CUDA."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


@functools.lru_cache(maxsize=None)  # pure, and asked at every decode launch (state_io.pool_args)
def gpu_model(name: str) -> str | None:
    """The GPU model in a device's name: "H100" of "NVIDIA H100 80GB HBM3"."""
    found = re.search(r"\b[A-Z]+\d+[A-Z]*\b", name)
    return found.group(0) if found else None


def gpu_key(device: str | None, tables: dict, first_otherwise: bool) -> str | None:
    """The key in ``tables`` whose entry ``device`` (a CUDA device's name; None: no GPU named) takes: its own, else
    one measured on the same model of GPU, else the first (``first_otherwise``: a full table, which any GPU must
    take) or None (an overlay, which applies only where it was measured)."""
    if device in tables:
        return device
    model = gpu_model(device) if device else None
    same = [key for key in tables if model is not None and gpu_model(key) == model]
    if same:
        return same[0]
    return next(iter(tables), None) if first_otherwise else None
