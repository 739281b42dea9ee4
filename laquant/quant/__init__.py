"""Quantized numerics and modules (the CPU reference path; Triton kernels plug in behind them)."""

from laquant.quant.numerics import FP8_E4M3_MAX, INT8_MAX, dequantize, quantize_fp8, quantize_int8
from laquant.quant.state import STATE_FORMATS, StateFormat, StateQuantizer, dequantize_state, quantize_state

__all__ = ["FP8_E4M3_MAX", "INT8_MAX", "STATE_FORMATS", "StateFormat", "StateQuantizer", "dequantize", "dequantize_state",
           "quantize_fp8", "quantize_int8", "quantize_state"]
