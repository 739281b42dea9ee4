"""The recurrent state as stored: one container (:class:`State`) from prefill to decode to the
cache, and the one codec (:class:`StateQuantizer`) that stores and loads it in a registry format
(:mod:`.formats`).

Scales are float32 and kept broadcastable to the data: ``[..., K, 1]`` per row, ``[..., 1, 1]``
per head, ``[]`` per tensor. The Triton kernels address per-row scales as ``[..., K]``; that is the
same memory (:attr:`State.row_scale`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import StateFormat, get_format
from .numerics import absmax_scale, dequantize


@dataclass
class State:
    """States ``data`` ``[N, H, K, V]`` (checkpoints: ``[N, C, H, K, V]``) in ``format``'s storage
    dtype, their float32 ``scale`` (None for the plain formats), and how many stores made them
    (the renormalisation schedule of :class:`StateQuantizer`)."""

    data: torch.Tensor
    scale: torch.Tensor | None
    format: str = "fp32"
    n_stores: int = 0

    def load(self) -> torch.Tensor:
        """The float32 states this stands for."""
        return dequantize_state(self.data, self.scale)

    @property
    def row_scale(self) -> torch.Tensor | None:
        """Per-row scales as the kernels address them, ``[..., K]`` (a view)."""
        return None if self.scale is None else self.scale.squeeze(-1)

    def nbytes(self) -> int:
        n = self.data.numel() * self.data.element_size()
        return n + (self.scale.numel() * self.scale.element_size() if self.scale is not None else 0)

    @classmethod
    def empty(cls, shape, fmt: str, device) -> State:
        """Uninitialised storage for states of ``shape`` ``[..., K, V]`` (per-row scales only)."""
        spec = get_format(fmt)
        scale = torch.empty(*shape[:-1], 1, dtype=torch.float32, device=device) if spec.is_scaled else None
        return cls(torch.empty(shape, dtype=spec.storage_dtype, device=device), scale, fmt)


def quantize_state(state: torch.Tensor, fmt: StateFormat | str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(data, scale)`` as stored with fresh scales; ``scale`` is None for the plain formats."""
    spec = get_format(fmt)
    if not spec.is_scaled:
        return state.to(spec.storage_dtype), None
    return spec.quantize(state, dim=spec.scale_dims)


def dequantize_state(data: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """The float32 state a stored ``(data, scale)`` stands for."""
    return data.float() if scale is None else dequantize(data, scale)


class StateQuantizer:
    """Stores and loads a layer's recurrent state in a registry format.

    Scales are dynamic when ``renorm_interval >= 1``: at every store a scale only grows (to the
    fresh state's absmax, so nothing clips), and every ``renorm_interval`` stores a full
    renormalisation recomputes it from the fresh state, so a decaying state gets its precision
    back (``1``: fresh scales at every store). ``renorm_interval = 0`` is the naive form: the
    calibrated ``static_scale`` is used for ever and values beyond it clip.
    """

    def __init__(self, fmt: StateFormat | str = "fp32", renorm_interval: int = 1,
                 static_scale: torch.Tensor | None = None):
        self.format = get_format(fmt)
        if renorm_interval < 0:
            raise ValueError(f"renorm_interval must be >= 0, got {renorm_interval}")
        if self.format.is_scaled and renorm_interval == 0 and static_scale is None:
            raise ValueError("renorm_interval = 0 (static scales) needs a calibrated static_scale")
        self.renorm_interval = renorm_interval
        self.static_scale = static_scale

    @property
    def is_plain_fp32(self) -> bool:
        """Storing changes nothing (so a prefill has no round trip to model)."""
        return self.format.name == "fp32"

    @property
    def uses_static_scale(self) -> bool:
        return self.format.is_scaled and self.renorm_interval == 0

    def store(self, state: torch.Tensor, prev_scale: torch.Tensor | None = None,
              n_stores: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.format.is_scaled:
            return quantize_state(state, self.format)
        if self.renorm_interval == 0:
            scale = self.static_scale.to(state.device)
        else:
            scale = self.fresh_scale(state)
            if prev_scale is not None and n_stores % self.renorm_interval != 0:
                scale = torch.maximum(scale, prev_scale)
        return self.quantize(state, scale)

    def store_state(self, state: torch.Tensor, prev: State | None = None) -> State:
        """``state`` stored as the next store after ``prev`` (None: the first)."""
        n_stores = prev.n_stores + 1 if prev is not None else 1
        data, scale = self.store(state, prev.scale if prev is not None else None, n_stores)
        return State(data, scale, self.format.name, n_stores)

    def fresh_scale(self, state: torch.Tensor) -> torch.Tensor:
        """The scale a store computes from ``state`` alone (scaled formats)."""
        return absmax_scale(state, self.format.scale_dims, self.format.qmax)

    def quantize(self, state: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``state`` in this (scaled) format with the given scale."""
        return self.format.quantize(state, scale=scale)

    @staticmethod
    def load(data: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return dequantize_state(data, scale)

    def roundtrip(self, state: torch.Tensor) -> torch.Tensor:
        return self.load(*self.store(state))


# A decode kernel's state pool: ``state`` ``[P, H, K, V]`` and per-row ``scale`` ``[P, H, K]``,
# slots picked by ``pool_idx``. These are the reference side of the kernels' load and store.

def load_pool_slots(state, scale, pool_idx, quantizer: StateQuantizer) -> torch.Tensor:
    """The float32 states of the pool slots ``pool_idx``."""
    idx = pool_idx.long()
    return quantizer.load(state[idx], scale[idx].unsqueeze(-1) if scale is not None else None)


def store_pool_slots(h, state, scale, pool_idx, quantizer: StateQuantizer, n_stores=None) -> None:
    """Store the new states ``h`` into the pool slots ``pool_idx`` in place, as a decode kernel does."""
    idx = pool_idx.long()
    old_scale = scale[idx].unsqueeze(-1) if scale is not None else None
    if quantizer.format.is_scaled and quantizer.renorm_interval > 1:
        # per slot: the scale only grows, except at a renormalisation (every N-th store of that slot)
        renorm_now = ((n_stores[idx] + 1) % quantizer.renorm_interval == 0).view(-1, 1, 1, 1)
        fresh = quantizer.fresh_scale(h)
        data, new_scale = quantizer.quantize(h, torch.where(renorm_now, fresh, torch.maximum(fresh, old_scale)))
    else:
        data, new_scale = quantizer.store(h)
    state[idx] = data
    if scale is not None:
        scale[idx] = new_scale.squeeze(-1).expand(len(idx), *scale.shape[1:])
