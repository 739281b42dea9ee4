"""The recurrent state as stored: one container (:class:`State`) from prefill to decode to the
cache, and the one codec (:class:`StateQuantizer`) that stores and loads it in a registry format
(:mod:`.formats`).

Scales are float32 and kept broadcastable to the data: ``[..., K, 1]`` per row, ``[..., 1, 1]``
per head, ``[]`` per tensor. The Triton kernels address per-row scales as ``[..., K]``; that is the
same memory (:attr:`State.row_scale`).

Stochastic rounding (``StateQuantizer(..., rounding="stochastic")``) draws each element's random
byte from Philox keyed by a seed, with the counter ``(element group, slot, store, sub-store)``
(:class:`StoreKey`); the kernels draw the same bytes (``triton_numerics.state_random_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import StateFormat, get_format
from .numerics import ROUNDINGS, STATE_PHILOX_ROUNDS, absmax_scale, dequantize, philox4x32

RANDOM_GROUP = 16  # elements of a state row that share one Philox call (16 random bytes)


def state_random_bytes(seed: int, slots: torch.Tensor, position, sub: int, shape) -> torch.Tensor:
    """The random bytes (int64, 0..255) a stochastic store of states ``shape`` ``[N, ..., H, K, V]``
    uses: element ``(h, k, v)`` of slot ``slots[n]`` at store ``position`` (int or ``[N]``) takes
    byte ``v % 16`` (little-endian within the four 32-bit words) of
    ``philox(seed, (h * K + k) * ceil(V / 16) + v // 16, slot, position, sub)`` at
    :data:`~.numerics.STATE_PHILOX_ROUNDS` rounds. ``sub`` is 0 for
    a store between calls or steps and ``j`` for a prefill's round trip or checkpoint after its
    ``j``-th 64-token chunk, so no two stores of one sequence share bits."""
    *lead, H, K, V = shape
    groups = -(-V // RANDOM_GROUP)
    extra = len(lead) - 1  # dimensions between the slot and the head (checkpoints)
    device = slots.device
    c0 = torch.arange(H * K * groups, device=device, dtype=torch.int64).view(H, K, groups)
    c1 = slots.long().view(-1, *([1] * (extra + 3)))
    c2 = torch.as_tensor(position, dtype=torch.int64, device=device).reshape(-1, *([1] * (extra + 3)))
    words = torch.stack(philox4x32(seed, c0, c1, c2, sub, STATE_PHILOX_ROUNDS), -1)  # [N, ..., H, K, groups, 4]
    shifts = torch.arange(0, 32, 8, device=device)
    bytes_ = (words.unsqueeze(-1) >> shifts) & 0xFF  # [..., groups, 4 words, 4 bytes]
    bytes_ = bytes_.reshape(*bytes_.shape[:-3], groups * RANDOM_GROUP)[..., :V]
    return bytes_.expand(*lead, H, K, V)


@dataclass(frozen=True)
class StoreKey:
    """What a stochastic store's random bits are keyed by: the ``seed``, each stored state's
    ``slots`` ``[N]`` (pool slot or batch row), the store ``position`` (its store count: int or
    ``[N]``) and ``sub`` (see :func:`state_random_bytes`)."""

    seed: int
    slots: torch.Tensor
    position: int | torch.Tensor
    sub: int = 0

    def random_bytes(self, shape) -> torch.Tensor:
        return state_random_bytes(self.seed, self.slots, self.position, self.sub, shape)

    @classmethod
    def for_batch(cls, seed: int, batch: int, position, device, sub: int = 0) -> StoreKey:
        """Slots ``0..batch-1`` (batch row ``b`` is slot ``b``, as the model's pools)."""
        return cls(seed, torch.arange(batch, device=device), position, sub)


@dataclass
class State:
    """States ``data`` ``[N, H, K, V]`` (checkpoints: ``[N, C, H, K, V]``; packed int4:
    ``[..., K, ceil(V / 2)]``, :meth:`StateFormat.storage_shape`) in ``format``'s storage dtype, their float32 ``scale`` (None for the plain formats), and how many stores made them
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
        return cls(torch.empty(spec.storage_shape(shape), dtype=spec.storage_dtype, device=device), scale, fmt)


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
                 static_scale: torch.Tensor | None = None, rounding: str = "nearest"):
        self.format = get_format(fmt)
        if renorm_interval < 0:
            raise ValueError(f"renorm_interval must be >= 0, got {renorm_interval}")
        if self.format.is_scaled and renorm_interval == 0 and static_scale is None:
            raise ValueError("renorm_interval = 0 (static scales) needs a calibrated static_scale")
        if rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {rounding!r}; allowed: {', '.join(ROUNDINGS)}")
        if rounding == "stochastic" and not self.format.is_scaled:
            raise ValueError(f"stochastic rounding applies to the scaled state formats, not {self.format.name!r}; "
                             "use rounding nearest or an fp8/int8/int4 format")
        self.renorm_interval = renorm_interval
        self.static_scale = static_scale
        self.rounding = rounding

    @property
    def stochastic(self) -> bool:
        return self.rounding == "stochastic"

    @property
    def is_plain_fp32(self) -> bool:
        """Storing changes nothing (so a prefill has no round trip to model)."""
        return self.format.name == "fp32"

    @property
    def uses_static_scale(self) -> bool:
        return self.format.is_scaled and self.renorm_interval == 0

    def store(self, state: torch.Tensor, prev_scale: torch.Tensor | None = None,
              n_stores: int = 0, key: StoreKey | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(data, scale)`` of ``state`` ``[N, ..., K, V]`` stored as store number ``n_stores``
        (``key``: the random bits' key, needed by stochastic rounding)."""
        if not self.format.is_scaled:
            return quantize_state(state, self.format)
        if self.renorm_interval == 0:
            scale = self.static_scale.to(state.device)
            if scale.dim():  # one scale per stored row, as a fresh one: the kernels address [..., K] per state
                scale = scale.expand(*state.shape[:state.dim() - scale.dim()], *scale.shape).contiguous()
        else:
            scale = self.fresh_scale(state)
            if prev_scale is not None and n_stores % self.renorm_interval != 0:
                scale = torch.maximum(scale, prev_scale)
        return self.quantize(state, scale, key)

    def store_state(self, state: torch.Tensor, prev: State | None = None, seed: int = 0) -> State:
        """``state`` ``[B, H, K, V]`` stored as the next store after ``prev`` (None: the first);
        stochastic rounding keys it by ``seed``, batch row and that store count."""
        n_stores = prev.n_stores + 1 if prev is not None else 1
        key = StoreKey.for_batch(seed, state.shape[0], n_stores, state.device) if self.stochastic else None
        data, scale = self.store(state, prev.scale if prev is not None else None, n_stores, key)
        return State(data, scale, self.format.name, n_stores)

    def fresh_scale(self, state: torch.Tensor) -> torch.Tensor:
        """The scale a store computes from ``state`` alone (scaled formats)."""
        return absmax_scale(state, self.format.scale_dims, self.format.qmax)

    def quantize(self, state: torch.Tensor, scale: torch.Tensor,
                 key: StoreKey | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``state`` in this (scaled) format with the given scale (stochastic rounding: bits by ``key``)."""
        if not self.stochastic:
            return self.format.quantize(state, scale=scale)
        if key is None:
            raise ValueError("a stochastic store needs the key of its random bits (seed, slots, position)")
        return self.format.quantize(state, scale=scale, rounding="stochastic", random=key.random_bytes(state.shape))

    @staticmethod
    def load(data: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return dequantize_state(data, scale)

    def roundtrip(self, state: torch.Tensor, key: StoreKey | None = None) -> torch.Tensor:
        return self.load(*self.store(state, key=key))

    def chunk_roundtrip(self, seed: int, slots: torch.Tensor, position: int):
        """The round trip a chunked prefill applies after each 64-token chunk (None: fp32 keeps the
        state as it is): the ``j``-th call of the returned function keys its bits by sub-store ``j``."""
        if self.is_plain_fp32:
            return None
        calls = iter(range(1, 1 << 62))
        return lambda state: self.roundtrip(state, StoreKey(seed, slots, position, next(calls))
                                            if self.stochastic else None)


# A decode kernel's state pool: ``state`` ``[P, H, K, V]`` and per-row ``scale`` ``[P, H, K]``,
# slots picked by ``pool_idx``. These are the reference side of the kernels' load and store.

def load_pool_slots(state, scale, pool_idx, quantizer: StateQuantizer) -> torch.Tensor:
    """The float32 states of the pool slots ``pool_idx``."""
    idx = pool_idx.long()
    return quantizer.load(state[idx], scale[idx].unsqueeze(-1) if scale is not None else None)


def store_pool_slots(h, state, scale, pool_idx, quantizer: StateQuantizer, n_stores=None, seed: int = 0) -> None:
    """Store the new states ``h`` into the pool slots ``pool_idx`` in place, as a decode kernel does
    (stochastic rounding: bits keyed by ``seed``, the slot and its store count ``n_stores + 1``)."""
    idx = pool_idx.long()
    counts = n_stores[idx].long() + 1 if n_stores is not None else None
    data, new_scale = store_slot_states(h, scale[idx] if scale is not None else None, quantizer, idx, counts, seed)
    state[idx] = data
    if scale is not None:
        scale[idx] = new_scale


def store_slot_states(h, old_scale, quantizer: StateQuantizer, slots, counts=None, seed: int = 0):
    """``(data, scale)`` of the float32 states ``h`` ``[N, H, K, V]`` of pool ``slots`` ``[N]`` stored
    as their store number ``counts`` ``[N]`` (the random bits' counter; with ``renorm_interval > 1``
    the scale only grows over ``old_scale`` ``[N, H, K]`` except at every N-th store). ``scale`` is
    ``[N, H, K]`` (None for the plain formats): what a decode step writes into those slots."""
    key = None
    if quantizer.stochastic:
        if counts is None:
            raise ValueError("stochastic rounding needs the per-slot store counts n_stores")
        key = StoreKey(seed, slots, counts)
    if quantizer.format.is_scaled and quantizer.renorm_interval > 1:
        if counts is None:
            raise ValueError("renorm_interval > 1 needs the per-slot store counts n_stores")
        renorm_now = (counts % quantizer.renorm_interval == 0).view(-1, 1, 1, 1)
        fresh = quantizer.fresh_scale(h)
        scale = torch.where(renorm_now, fresh, torch.maximum(fresh, old_scale.unsqueeze(-1)))
        data, new_scale = quantizer.quantize(h, scale, key)
    else:
        data, new_scale = quantizer.store(h, key=key)
    if new_scale is not None:
        new_scale = new_scale.squeeze(-1).expand(*h.shape[:-1])
    return data, new_scale
