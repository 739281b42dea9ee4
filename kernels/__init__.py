"""laquant.kernels: the numerics of the quantized path.

Each op has a plain-PyTorch reference (the spec, and the CPU path); Triton kernels sit beside
their reference and are chosen on CUDA.
"""

# From a checkout's root (``python -m ...``), this folder is also importable as a top-level
# ``kernels``, the name of Hugging Face's package, which transformers probes by importing it. That
# import must stay empty: pulling in laquant (and so transformers) from there is a circular import.
if __name__ == "laquant.kernels":
    from laquant.kernels.delta_reference import (
        chunk_gated_delta_rule,
        recurrent_gated_delta_rule,
        recurrent_gated_delta_rule_step,
    )
    from laquant.kernels.gla_reference import (
        chunk_gla,
        naive_gla,
        noncausal_linear_attention,
        recurrent_gla,
        recurrent_gla_step,
    )
    from laquant.kernels.int8_reference import int8_matmul_exact, int8_outlier_linear

    __all__ = ["chunk_gated_delta_rule", "chunk_gla", "int8_matmul_exact", "int8_outlier_linear", "naive_gla",
               "noncausal_linear_attention", "recurrent_gated_delta_rule", "recurrent_gated_delta_rule_step",
               "recurrent_gla", "recurrent_gla_step"]
