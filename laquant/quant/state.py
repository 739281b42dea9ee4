"""Storage formats for the recurrent state ``[..., K, V]`` (one matrix per head).

The state is always updated in float32; a format only says how it is stored between steps:

* ``fp32`` / ``bf16``: plain casts;
* ``fp8_row``: fp8 e4m3 with one float32 scale per K row (``[..., K, 1]``), recomputed from the
  fresh state at every store;
* ``fp8_head``: fp8 e4m3 with one float32 scale per head (``[..., 1, 1]``);
* ``fp8_tensor``: fp8 e4m3 with one float32 scale for the whole tensor (the naive form);
* ``int8_row``: int8 with one float32 scale per K row: the same bytes as ``fp8_row``, but a
  uniform grid of 255 steps over each row instead of 3 mantissa bits per element.

The scaled formats (fp8_*, int8_row) store float32 scales beside the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from laquant.quant.numerics import FP8_E4M3_MAX, INT8_MAX, absmax_scale, dequantize, quantize_fp8, quantize_int8

STATE_FORMATS = ("fp32", "bf16", "fp8_row", "fp8_head", "fp8_tensor", "int8_row")
# scaled formats: the dimensions one scale covers, the largest code, and the quantizer
_SCALED = {
    "fp8_row": (-1, FP8_E4M3_MAX, quantize_fp8),
    "fp8_head": ((-2, -1), FP8_E4M3_MAX, quantize_fp8),
    "fp8_tensor": (None, FP8_E4M3_MAX, quantize_fp8),
    "int8_row": (-1, INT8_MAX, quantize_int8),
}


@dataclass
class StateFormat:
    name: str = "fp32"

    def __post_init__(self):
        if self.name not in STATE_FORMATS:
            raise ValueError(f"unknown state format {self.name!r}; allowed: {', '.join(STATE_FORMATS)}")

    @property
    def is_scaled(self) -> bool:
        return self.name in _SCALED

    @property
    def qmax(self) -> float:
        return _SCALED[self.name][1]

    @property
    def granularity(self) -> str:
        """``row``, ``head`` or ``tensor``: what one scale covers."""
        return self.name.rsplit("_", 1)[-1]

    def bytes_per_state(self, k: int, v: int, heads: int = 1) -> int:
        """Bytes to store ``heads`` states of ``[k, v]``, scales included."""
        if self.name == "fp32":
            return 4 * heads * k * v
        if self.name == "bf16":
            return 2 * heads * k * v
        scales = {"fp8_row": heads * k, "int8_row": heads * k, "fp8_head": heads, "fp8_tensor": 1}[self.name]
        return heads * k * v + 4 * scales


def quantize_state(state: torch.Tensor, fmt: StateFormat) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(data, scale)`` as stored; ``scale`` is None for the plain formats."""
    if fmt.name == "fp32":
        return state.float(), None
    if fmt.name == "bf16":
        return state.to(torch.bfloat16), None
    dims, _, quantize = _SCALED[fmt.name]
    return quantize(state, dim=dims)


def dequantize_state(data: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """The float32 state a stored ``(data, scale)`` stands for."""
    return data.float() if scale is None else dequantize(data, scale)


class StateQuantizer:
    """Stores and loads a layer's recurrent state in a :class:`StateFormat`.

    fp8 scales are dynamic when ``renorm_interval >= 1``: at every store a scale only grows (to
    the fresh state's absmax, so nothing clips), and every ``renorm_interval`` stores a full
    renormalisation recomputes it from the fresh state, so a decaying state gets its precision
    back (``1``: fresh scales at every store). ``renorm_interval = 0`` is the naive form: the
    calibrated ``static_scale`` is used for ever and values beyond it clip.
    """

    def __init__(self, fmt: StateFormat | str = "fp32", renorm_interval: int = 1,
                 static_scale: torch.Tensor | None = None):
        self.format = fmt if isinstance(fmt, StateFormat) else StateFormat(fmt)
        if renorm_interval < 0:
            raise ValueError(f"renorm_interval must be >= 0, got {renorm_interval}")
        if self.format.is_scaled and renorm_interval == 0 and static_scale is None:
            raise ValueError("renorm_interval = 0 (static scales) needs a calibrated static_scale")
        self.renorm_interval = renorm_interval
        self.static_scale = static_scale

    def store(self, state: torch.Tensor, prev_scale: torch.Tensor | None = None,
              n_stores: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        fmt = self.format
        if not fmt.is_scaled:
            return quantize_state(state, fmt)
        if self.renorm_interval == 0:
            scale = self.static_scale.to(state.device)
        else:
            scale = self.fresh_scale(state)
            if prev_scale is not None and n_stores % self.renorm_interval != 0:
                scale = torch.maximum(scale, prev_scale)
        return self.quantize(state, scale)

    def fresh_scale(self, state: torch.Tensor) -> torch.Tensor:
        """The scale a store computes from ``state`` alone (scaled formats)."""
        dims, qmax, _ = _SCALED[self.format.name]
        return absmax_scale(state, dims, qmax)

    def quantize(self, state: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``state`` in this (scaled) format with the given scale."""
        return _SCALED[self.format.name][2](state, scale=scale)

    @staticmethod
    def load(data: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return dequantize_state(data, scale)

    def roundtrip(self, state: torch.Tensor) -> torch.Tensor:
        return self.load(*self.store(state))
