"""Quantized modules (``QuantLinear``, ``QuantGate``), and the numerics and state formats they use,
re-exported from their one implementation in :mod:`laquant.kernels.common`."""

from laquant.kernels.common.formats import STATE_FORMATS, StateFormat, get_format
from laquant.kernels.common.numerics import FP8_E4M3_MAX, INT8_MAX, dequantize, quantize_fp8, quantize_int8
from laquant.kernels.common.state import State, StateQuantizer, dequantize_state, quantize_state

__all__ = ["FP8_E4M3_MAX", "INT8_MAX", "STATE_FORMATS", "State", "StateFormat", "StateQuantizer", "dequantize",
           "dequantize_state", "get_format", "quantize_fp8", "quantize_int8", "quantize_state"]
