"""What every kernel shares: the state-format registry, the state container and codec, the
quantize/dequantize numerics (PyTorch and Triton), and the choice of implementation."""
