"""laquant.kernels: the numerics of the quantized path.

Each op has a plain-PyTorch reference (the spec, and the CPU path); Triton kernels sit beside
their reference and are chosen on CUDA.
"""

from laquant.kernels.gla_reference import chunk_gla, naive_gla, recurrent_gla, recurrent_gla_step

__all__ = ["chunk_gla", "naive_gla", "recurrent_gla", "recurrent_gla_step"]
