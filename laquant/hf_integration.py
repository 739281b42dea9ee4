"""``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` for laquant checkpoints.

Importing laquant registers a quantization config and a quantizer named ``laquant``: transformers
builds the model skeleton, the quantizer rewrites it into laquant's quantized modules from the
recorded decisions, and transformers then loads ``model.safetensors`` into it.
"""

from __future__ import annotations

import torch
from transformers.quantizers import HfQuantizer, register_quantization_config, register_quantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from laquant.checkpoint import QUANT_METHOD


@register_quantization_config(QUANT_METHOD)
class LaquantConfig(QuantizationConfigMixin):
    def __init__(self, recipe: dict | None = None, decisions: dict | None = None, format_version: int = 1,
                 **kwargs):
        self.quant_method = QUANT_METHOD
        self.recipe = recipe or {}
        self.decisions = decisions or {"projections": {}, "gates": {}, "state": {}}
        self.format_version = format_version

    def to_dict(self) -> dict:
        return {"quant_method": QUANT_METHOD, "format_version": self.format_version,
                "recipe": self.recipe, "decisions": self.decisions}


@register_quantizer(QUANT_METHOD)
class LaquantHfQuantizer(HfQuantizer):
    requires_calibration = True  # checkpoints come from `laquant calibrate`, never quantized on load

    def validate_environment(self, *args, **kwargs):
        return None

    def update_dtype(self, dtype):
        # float32 compute by default: the checkpoint's float weights are bf16-exact either way
        return torch.float32 if dtype is None else dtype

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        return False

    def _process_model_before_weight_loading(self, model, **kwargs):
        from laquant.adapters import install
        from laquant.quantize import build_empty

        build_empty(model, install(model), self.quantization_config.decisions)
        return model

    def _process_model_after_weight_loading(self, model, **kwargs):
        return model

    def is_serializable(self, safe_serialization=None) -> bool:
        # a method in transformers' interface; save_pretrained writes the quantized buffers and this
        # quantization_config, which from_pretrained and laquant.load rebuild bit for bit (laquant.save
        # also writes the statistics, recipe.yaml and report.md)
        return True

    @property
    def is_trainable(self) -> bool:
        return False
