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


def _exists(model, name: str) -> bool:
    try:
        model.get_parameter_or_buffer(name)
    except AttributeError:
        return False
    return True


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

        # transformers ties weights after loading them (tie_weights does nothing while it builds the
        # model); laquant makes a tied block (zamba2's shared transformer) one module before
        # quantizing it, so it ties them here, as transformers would
        for target, source in (getattr(model, "all_tied_weights_keys", None) or {}).items():
            parent, _, name = target.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, name, model.get_parameter_or_buffer(source))
        build_empty(model, install(model), self.quantization_config.decisions)
        # ties naming a tensor that a quantized module replaced are gone (its aliases are one module now)
        tied = getattr(model, "all_tied_weights_keys", None) or {}
        model.all_tied_weights_keys = {t: s for t, s in tied.items() if _exists(model, t) and _exists(model, s)}
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
