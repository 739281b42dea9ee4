"""``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` for laquant checkpoints.

Importing laquant registers a quantization config and a quantizer named ``laquant``: transformers
builds the model skeleton, the quantizer rewrites it into laquant's quantized modules from the
recorded decisions, and transformers then loads the weights (one file or shards) into it.

Without laquant a checkpoint must never load as random weights (transformers skips an unknown
``quant_method`` with a warning and leaves every quantized projection randomly initialised). So
every checkpoint laquant writes (``laquant.save`` and a quantized model's ``save_pretrained``)
has, in its config.json:

- ``transformers_weights``: a sentence where transformers expects the weights' file name. Plain
  transformers refuses it, quoting it ("... pip install laquant ..."); laquant's quantizer
  clears it before transformers reads it.
- ``auto_map`` to ``laquant_remote.py``, written beside the weights: with
  ``trust_remote_code=True`` transformers imports it, which imports laquant (transformers says to
  ``pip install laquant`` if that fails) and loads the checkpoint through laquant.

and ``laquant.json``, the digests :mod:`laquant.integrity` checks on load.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers.quantizers import HfQuantizer, register_quantization_config, register_quantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from laquant.checkpoint import (NO_LAQUANT_GUARD, QUANT_METHOD, REMOTE_CODE_MODULE, WEIGHTS_INDEX_NAME,
                                without_loader_fields)
from laquant.errors import LaquantError

_REMOTE_CODE = '''"""transformers remote code for a laquant checkpoint (model_type {model_type!r}).

``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` imports this module, which needs
laquant installed (``pip install laquant``; transformers names the missing package otherwise).
Importing laquant registers its quantizer; the classes below are laquant's model for this type.
"""

import laquant  # noqa: F401  (registers the laquant quantization method with transformers)
from laquant.hf_integration import family_classes

_config_class, _model_class = family_classes({model_type!r})


class LaquantConfig(_config_class):
    pass


class LaquantForCausalLM(_model_class):
{body}
'''


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
        # transformers passes float32 when no dtype is given (and config.json's, the base model's, for
        # dtype="auto"): the checkpoint's float weights are exact in either
        return torch.float32 if dtype is None else dtype

    def update_attn_implementation(self, config):  # transformers >= 5.2x: see _drop_loader_fields
        return self._drop_loader_fields(config)

    def update_tp_plan(self, config):  # transformers 5.17's first hook with the config
        return self._drop_loader_fields(config)

    @staticmethod
    def _drop_loader_fields(config):
        # the first hook that sees the config before transformers resolves the weight files: laquant
        # is here, so the guard against loading without it goes
        # (and the remote-code auto_map, already used if it was to be): the loaded model's config is the
        # base model's, so an export of it (compressed-tensors, a plain save) does not inherit them
        fields = without_loader_fields({"transformers_weights": getattr(config, "transformers_weights", None),
                                        "auto_map": getattr(config, "auto_map", None)})
        if "transformers_weights" in config and "transformers_weights" not in fields:
            delattr(config, "transformers_weights")
        if getattr(config, "auto_map", None) is not None:
            if fields.get("auto_map"):
                config.auto_map = fields["auto_map"]
            else:
                delattr(config, "auto_map")
        return config

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        return False

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        from laquant.adapters import install
        from laquant.integrity import verify_checkpoint
        from laquant.quantize import build_empty

        if checkpoint_files:  # digests in laquant.json beside the weights (LAQUANT_NO_VERIFY=1 skips)
            verify_checkpoint(Path(checkpoint_files[0]).parent)
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
        attach_laquant_methods(model)
        return model

    def is_serializable(self, safe_serialization=None) -> bool:
        # a method in transformers' interface; save_pretrained writes the quantized buffers and this
        # quantization_config, which from_pretrained and laquant.load rebuild bit for bit (laquant.save
        # also writes the statistics, recipe.yaml and report.md)
        return True

    @property
    def is_trainable(self) -> bool:
        return False


def family_classes(model_type: str):
    """``(config class, model class)`` laquant loads ``model_type`` with (the remote-code module's bases):
    the causal LM, or a vision-language family's whole model (its Auto class's)."""
    from laquant.families import get_family

    family = get_family(model_type)
    if family.native:
        cls = family.model_class()
        return cls.config_class, cls
    return family.config_class(), family.model_class()


def weight_count(model) -> int:
    """Parameters plus the weights of laquant's quantized projections (int8 buffers, not parameters,
    which ``PreTrainedModel.num_parameters`` alone would leave out): the unquantized model's count."""
    from laquant.quant.modules import QuantLinear

    count = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, QuantLinear):
            count += module.in_features * module.out_features + (module.bias.numel() if module.bias is not None else 0)
    return count


def mark_quantized(model, recipe: dict, decisions: dict) -> None:
    """Keep the recipe and decisions on the model's config, so that transformers' ``save_pretrained``
    writes a checkpoint that reloads as quantized (without them it would reload as an unquantized
    model with missing weights), and give the model laquant's ``save_pretrained`` and ``num_parameters``."""
    model.config.quantization_config = LaquantConfig(recipe=recipe, decisions=decisions)
    attach_laquant_methods(model)


def attach_laquant_methods(model) -> None:
    """Per instance (transformers' hybrid classes are shared with unquantized models):
    ``save_pretrained`` that finishes the folder as a laquant checkpoint (guard, remote code,
    digests), and ``num_parameters`` that counts the int8 weights."""
    import types

    model.save_pretrained = types.MethodType(_save_pretrained, model)
    model.num_parameters = types.MethodType(_num_parameters, model)


def _save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
    repo_id = kwargs.pop("repo_id", None)
    type(self).save_pretrained(self, save_directory, *args, **kwargs)
    finish_checkpoint(Path(save_directory), self.config.model_type)
    if push_to_hub:  # push_to_hub saves through this method into its own folder, then uploads that
        self.push_to_hub(repo_id or Path(save_directory).name)


def _num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
    count = type(self).num_parameters(self, only_trainable=only_trainable, exclude_embeddings=exclude_embeddings)
    if only_trainable:
        return count
    return count + weight_count(self) - sum(p.numel() for p in self.parameters())


def finish_checkpoint(folder: Path, model_type: str) -> None:
    """Make ``folder`` (config.json and weights written) a laquant checkpoint that plain transformers
    refuses, that loads with ``trust_remote_code=True``, and whose files' digests are recorded."""
    from laquant.checkpoint import weight_files
    from laquant.families import get_family
    from laquant.integrity import DIGESTED, write_manifest

    folder = Path(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if config.get("quantization_config", {}).get("quant_method") != QUANT_METHOD:
        raise LaquantError(f"{folder}: not a laquant checkpoint (config.json has no laquant quantization_config)")
    config["transformers_weights"] = NO_LAQUANT_GUARD
    family = get_family(model_type)
    auto_map = {family.auto_class: f"{REMOTE_CODE_MODULE}.LaquantForCausalLM"}
    if family.native:  # unknown to plain transformers: its config class comes from the module too
        auto_map["AutoConfig"] = f"{REMOTE_CODE_MODULE}.LaquantConfig"
    config["auto_map"] = {**config.get("auto_map", {}), **auto_map}
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    # transformers registers the remote model for the remote config class, which must then be its config_class
    body = "    config_class = LaquantConfig" if "AutoConfig" in auto_map else "    pass"
    (folder / f"{REMOTE_CODE_MODULE}.py").write_text(_REMOTE_CODE.format(model_type=model_type, body=body))
    files = [f.name for f in weight_files(folder)] + [f"{REMOTE_CODE_MODULE}.py"]
    files += [name for name in (WEIGHTS_INDEX_NAME, *DIGESTED) if (folder / name).is_file()]
    write_manifest(folder, files)
