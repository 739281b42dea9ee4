"""laquant.kernels: the numerics of the quantized path, the bottom layer of laquant.

Grouped by recurrence as flash-linear-attention groups its ops: ``gla/`` (gated linear attention:
``reference``, ``chunk``, ``decode``, ``noncausal``), ``delta/`` (the gated delta rule:
``reference``, ``chunk``, ``decode``), ``kda/`` (Kimi Delta Attention, the delta rule with a
per-channel decay: ``reference``, ``chunk``, ``decode`` on the delta rule's kernels), ``gemm/``
(int8 GEMM with the outlier split: ``reference``, ``int8``), and ``common/`` (the state-format
registry, the state container and codec, the one quantize/dequantize implementation and its Triton
twin, dispatch). Each Triton kernel sits beside its plain-PyTorch reference, which is its spec and
the CPU path. Nothing here imports the rest of laquant: kernels take tensors, numbers and the types
of ``common/``.
"""

# From a checkout's root (``python -m ...``), this folder is also importable as a top-level
# ``kernels``, the name of Hugging Face's package, which transformers probes by importing it. That
# import must stay empty: transformers would take it for Hugging Face's package.
if __name__ == "laquant.kernels":
    from .delta.reference import chunk_gated_delta_rule, recurrent_gated_delta_rule, recurrent_gated_delta_rule_step
    from .gemm.reference import int8_matmul_exact, int8_outlier_linear
    from .gla.reference import chunk_gla, naive_gla, noncausal_linear_attention, recurrent_gla, recurrent_gla_step
    from .kda.reference import chunk_kda, recurrent_kda

    __all__ = ["chunk_gated_delta_rule", "chunk_gla", "chunk_kda", "int8_matmul_exact", "int8_outlier_linear",
               "naive_gla", "noncausal_linear_attention", "recurrent_gated_delta_rule", "recurrent_gated_delta_rule_step",
               "recurrent_gla", "recurrent_gla_step", "recurrent_kda"]
