"""The state-format registry: how a recurrent state ``[..., K, V]`` (one matrix per head) is stored.

The state is always updated in float32; a format only says how it is stored between steps. One
row per format, read by the quantizer (:mod:`.state`), the references, the dispatch and the Triton
wrappers:

* ``fp32`` / ``bf16``: plain casts;
* ``fp8_row``: fp8 e4m3 with one float32 scale per K row (``[..., K, 1]``), recomputed from the
  fresh state at every store;
* ``fp8_head``: fp8 e4m3 with one float32 scale per head (``[..., 1, 1]``);
* ``fp8_tensor``: fp8 e4m3 with one float32 scale for the whole tensor (the naive form);
* ``int8_row``: int8 with one float32 scale per K row: the same bytes as ``fp8_row``, but a
  uniform grid of 255 steps over each row instead of 3 mantissa bits per element;
* ``int4_row``: int4 codes in ``[-7, 7]`` with one float32 scale per K row, two codes per byte
  (``uint8`` data ``[..., K, ceil(V / 2)]``, :func:`~.numerics.pack_int4`; an odd V pads each row's
  last byte with a code that is never stored). Reference path only: no kernel stores it, so the
  dispatch keeps it on the PyTorch references on CUDA too, and the kernels' wrappers refuse it.

Adding a format is one row here and its name in :mod:`.format_names` (checked at import), plus
its branch in the kernels' ``encode_state`` when it gets a kernel code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import format_names
from .numerics import FP8_DTYPE, FP8_E4M3_MAX, INT4_MAX, INT8_MAX, quantize_fp8, quantize_int4, quantize_int8


@dataclass(frozen=True)
class StateFormat:
    """One row of the registry. ``StateFormat("fp8_row")`` (the name alone) is that format's row."""

    name: str
    storage_dtype: torch.dtype | None = None
    granularity: str | None = None  # what one float32 scale covers: "row", "head" or "tensor"; None: no scale
    qmax: float = 1.0  # the largest code of a scaled format
    quantize: Callable | None = None  # (x, dim=..., scale=...) -> (codes, scale), from .numerics
    kernel_code: int | None = None  # the Triton kernels' FMT constexpr; None: reference path only
    codes_per_byte: int = 1  # 2: sub-byte codes packed along V (the data is [..., K, ceil(V / 2)])

    def __post_init__(self):
        if self.storage_dtype is None:  # looked up by name
            row = get_format(self.name)
            for field in ("storage_dtype", "granularity", "qmax", "quantize", "kernel_code", "codes_per_byte"):
                object.__setattr__(self, field, getattr(row, field))

    @property
    def is_scaled(self) -> bool:
        return self.granularity is not None

    @property
    def scale_dims(self) -> int | tuple[int, int] | None:
        """The dimensions of ``[..., K, V]`` one scale reduces over (None: all of them)."""
        return {"row": -1, "head": (-2, -1), "tensor": None}[self.granularity]

    def scale_shape(self, heads: int, k: int) -> tuple[int, ...]:
        """The shape of one state's scales ``[heads, k, 1]`` / ``[heads, 1, 1]`` / ``[]`` (scaled formats)."""
        return {"row": (heads, k, 1), "head": (heads, 1, 1), "tensor": ()}[self.granularity]

    def storage_shape(self, shape) -> tuple[int, ...]:
        """The data's shape for states of ``shape`` ``[..., K, V]``: ``[..., K, ceil(V / codes_per_byte)]``."""
        *lead, v = shape
        return (*lead, -(-v // self.codes_per_byte))

    def bytes_per_state(self, k: int, v: int, heads: int = 1) -> int:
        """Bytes to store ``heads`` states of ``[k, v]``, scales included."""
        data = heads * k * self.storage_shape((v,))[0] * torch.empty(0, dtype=self.storage_dtype).element_size()
        if not self.is_scaled:
            return data
        return data + 4 * max(1, torch.Size(self.scale_shape(heads, k)).numel())


_FORMATS = (
    StateFormat("fp32", torch.float32, kernel_code=0),
    StateFormat("bf16", torch.bfloat16, kernel_code=1),
    StateFormat("fp8_row", FP8_DTYPE, "row", FP8_E4M3_MAX, quantize_fp8, kernel_code=2),
    StateFormat("fp8_head", FP8_DTYPE, "head", FP8_E4M3_MAX, quantize_fp8),
    StateFormat("fp8_tensor", FP8_DTYPE, "tensor", FP8_E4M3_MAX, quantize_fp8),
    StateFormat("int8_row", torch.int8, "row", INT8_MAX, quantize_int8, kernel_code=3),
    StateFormat("int4_row", torch.uint8, "row", INT4_MAX, quantize_int4, codes_per_byte=2),
)
FORMATS: dict[str, StateFormat] = {f.name: f for f in _FORMATS}
STATE_FORMATS = tuple(FORMATS)
if (STATE_FORMATS != format_names.STATE_FORMATS
        or tuple(f.name for f in _FORMATS if f.is_scaled) != format_names.SCALED_STATE_FORMATS):
    raise ImportError(f"the state-format rows {STATE_FORMATS} and kernels/common/format_names.py "
                      f"{format_names.STATE_FORMATS} differ: list a new format's name there too")
KERNEL_FORMATS = tuple(f.name for f in _FORMATS if f.kernel_code is not None)


def get_format(fmt: StateFormat | str) -> StateFormat:
    if isinstance(fmt, StateFormat):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"unknown state format {fmt!r}; allowed: {', '.join(STATE_FORMATS)}")
    return FORMATS[fmt]


def kernel_code(fmt: StateFormat | str) -> int:
    """The Triton kernels' code of a format; a clear error for a format they do not store."""
    spec = get_format(fmt)
    if spec.kernel_code is None:
        raise ValueError(f"laquant's Triton kernels store states as {', '.join(KERNEL_FORMATS)}, not {spec.name!r} "
                         "(its reference path runs on any device; LAQUANT_KERNELS=reference selects it)")
    return spec.kernel_code
