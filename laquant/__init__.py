"""laquant: post-training quantization for linear-attention and hybrid language models.

``laquant.calibrate(model, recipe, data)`` quantizes a model in place, ``laquant.save`` writes a
checkpoint folder, ``laquant.load`` reads one back, ``laquant.export_compressed_tensors`` writes
the compressed-tensors W8A8 form serving engines load. Importing laquant registers model_type "gla"
and the "laquant" quantization method with transformers.
"""

__version__ = "0.1.0"

from laquant import hf_integration as _hf_integration  # noqa: E402,F401  (registers the quantizer)
from laquant import models  # noqa: E402,F401  (registers model types with transformers)
from laquant.api import Calibrated, calibrate, load, save  # noqa: E402
from laquant.compressed_tensors_export import export_compressed_tensors  # noqa: E402
from laquant.errors import LaquantError  # noqa: E402
from laquant.loading import load_model  # noqa: E402

__all__ = ["Calibrated", "LaquantError", "calibrate", "export_compressed_tensors", "load", "load_model", "save"]
