"""laquant: post-training quantization for linear-attention and hybrid language models.

``laquant.calibrate(model, recipe, data)`` quantizes a model in place, ``laquant.save`` writes a
checkpoint folder (``laquant.calibrate_streamed`` does both for a model read from its files layer by
layer, never whole in memory), ``laquant.load`` reads one back, ``laquant.export_compressed_tensors`` writes
the compressed-tensors W8A8 form serving engines load. Importing laquant registers model_type "gla"
and the "laquant" quantization method with transformers: at once if transformers is already
imported, otherwise as soon as it is (:mod:`laquant._registration`). The package imports torch
and transformers only when something here needs them, so that ``laquant --help`` and argument
errors answer at once.
"""

from importlib import import_module

from laquant import _registration
from laquant.errors import LaquantError

__version__ = "0.1.0"

_LAZY = {"Calibrated": "laquant.api", "calibrate": "laquant.api", "load": "laquant.api", "save": "laquant.api",
         "calibrate_streamed": "laquant.streaming",
         "load_model": "laquant.loading", "export_compressed_tensors": "laquant.compressed_tensors_export"}

__all__ = ["Calibrated", "LaquantError", "calibrate", "calibrate_streamed", "export_compressed_tensors", "load", "load_model", "save"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'laquant' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAZY})


_registration.register_with_transformers()
