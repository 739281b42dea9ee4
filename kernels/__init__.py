"""laquant.kernels: the numerics of the quantized path.

Each op has a plain-PyTorch reference (the spec, and the CPU path); Triton kernels sit beside
their reference and are chosen on CUDA.
"""

from laquant.kernels.gla_reference import chunk_gla, naive_gla, recurrent_gla, recurrent_gla_step
from laquant.kernels.int8_reference import int8_matmul_exact, int8_outlier_linear

__all__ = ["chunk_gla", "int8_matmul_exact", "int8_outlier_linear", "naive_gla", "recurrent_gla", "recurrent_gla_step"]
