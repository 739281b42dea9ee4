"""laquant.kernels: the numerics of the quantized path, the bottom layer of laquant.

Grouped by recurrence as flash-linear-attention groups its ops: ``gla/`` (gated linear attention:
``reference``, ``chunk``, ``decode``, ``noncausal``), ``delta/`` (the gated delta rule:
``reference``, ``chunk``, ``decode``), ``kda/`` (Kimi Delta Attention, the delta rule with a
per-channel decay: ``reference``, ``chunk``, ``decode`` on the delta rule's kernels), ``gemm/``
(int8 GEMM with the outlier split: ``reference``, ``int8``), ``conv/`` (a decode token's short conv),
``rowwise/`` (the fused norms and SwiGLU), and ``common/`` (the state-format
registry, the state container and codec, the one quantize/dequantize implementation and its Triton
twin, dispatch). Each Triton kernel sits beside its plain-PyTorch reference, which is its spec and
the CPU path. Nothing here imports the rest of laquant: kernels take tensors, numbers and the types
of ``common/``.
"""

# From a checkout's root (``python -m ...``), this folder is also importable as a top-level
# ``kernels``, the name of Hugging Face's package, which transformers probes and imports (a dependency of
# transformers since 5.25). Imported under that name, it hands the import over to Hugging Face's package where one
# is installed (the finder skips this checkout's root), and otherwise stays empty: transformers must never take it
# for Hugging Face's package, nor reach laquant through it.
if __name__ == "kernels":
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _spec = importlib.machinery.PathFinder.find_spec(
        "kernels", [p for p in sys.path if os.path.abspath(p or os.curdir) != _checkout])
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        sys.modules["kernels"] = _module  # an import statement returns what sys.modules holds once this has run
        _spec.loader.exec_module(_module)
elif __name__ == "laquant.kernels":  # references load on first use: laquant.kernels.common.format_names needs no torch
    from importlib import import_module

    _WHERE = {
        ".delta.reference": ("chunk_gated_delta_rule", "recurrent_gated_delta_rule", "recurrent_gated_delta_rule_step"),
        ".gemm.reference": ("int8_matmul_exact", "int8_outlier_linear"),
        ".gla.reference": ("chunk_gla", "naive_gla", "noncausal_linear_attention", "recurrent_gla", "recurrent_gla_step"),
        ".kda.reference": ("chunk_kda", "recurrent_kda"),
    }
    _MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
    __all__ = sorted(_MODULE_OF)

    def __getattr__(name: str):
        if name not in _MODULE_OF:
            raise AttributeError(f"module 'laquant.kernels' has no attribute {name!r}")
        value = getattr(import_module(_MODULE_OF[name], __name__), name)
        globals()[name] = value
        return value
