"""laquant: post-training quantization for linear-attention and hybrid language models."""

__version__ = "0.1.0"

from laquant import models  # noqa: E402,F401  (registers model types with transformers)
