"""Finding and loading models: the embedded default, local directories and Hugging Face ids."""

from __future__ import annotations

from pathlib import Path

import torch

from laquant.errors import LaquantError
from laquant.families import get_family
# where a model is, checked without torch, lives in laquant.paths (the CLI checks it before torch loads)
from laquant.paths import DEFAULT_MODEL_NAME, HUB_FILES, default_model_dir, read_config, resolve_model_dir  # noqa: F401


def read_supported_config(model_dir: Path) -> dict:
    """The model's config.json, after checking that laquant supports its architecture."""
    cfg = read_config(model_dir)
    model_config(cfg, model_dir)  # an unsupported model_type, or a config transformers would refuse, fails here
    return cfg


def config_dtype(cfg: dict) -> torch.dtype:
    """The dtype a config.json names (``dtype``, or the older ``torch_dtype``); float32 if none."""
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise LaquantError(f"config.json names dtype {name!r}, which is not a torch float dtype")
    return dtype


def load_tokenizer(spec: str | Path | None = None):
    from transformers import AutoTokenizer

    model_dir = resolve_model_dir(spec)
    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:
        raise LaquantError(f"could not load the tokenizer from {model_dir} ({type(exc).__name__})") from None


def model_config(cfg: dict, source: Path | str):
    """The config object of a supported ``config.json`` dict."""
    from laquant.checkpoint import without_loader_fields

    family = get_family(cfg.get("model_type"), f"{source}: model_type")
    cfg = without_loader_fields({k: v for k, v in cfg.items() if k != "quantization_config"})
    if family.native:
        try:
            return family.config(cfg)
        except ValueError as exc:  # options laquant's implementation does not have
            raise LaquantError(f"{source}: {exc}") from None
    try:
        return family.config(cfg)
    except Exception as exc:  # transformers' validators: name the field they reject
        reason = [line.strip() for line in str(exc).splitlines() if line.strip()][-1]
        raise LaquantError(f"{source}: config.json is not a valid {family.model_type} config: {reason}") from None


def empty_model(cfg: dict, source: Path | str, dtype: torch.dtype):
    """A model of ``cfg``'s architecture with laquant's mixers in place, weights uninitialised
    (to load a checkpoint into)."""
    from laquant.adapters import install

    config = model_config(cfg, source)
    family = get_family(config.model_type)
    with _skip_weight_init():  # every weight is overwritten by the checkpoint: no random init of each
        model = family.from_config(config).to(dtype)
    model.tie_weights()  # skipped with the initialisation; tied tensors (zamba2's shared blocks) are stored once
    install(model)
    return model


def _skip_weight_init():
    """transformers' context that skips weight initialisation (its module moved between versions)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            from contextlib import nullcontext as no_init_weights
    return no_init_weights()


def load_model(spec: str | Path | None = None, device: str | torch.device = "cpu",
               dtype: torch.dtype | str = torch.float32):
    """Load a supported model and its tokenizer, in eval mode: GLA on laquant's implementation, the
    transformers hybrids with laquant's mixers in place of their linear-attention layers."""
    from transformers.utils import logging as hf_logging

    from laquant.adapters import install

    model_dir = resolve_model_dir(spec)
    cfg = read_supported_config(model_dir)
    dtype = config_dtype(cfg) if dtype == "auto" else dtype
    if not any(model_dir.glob("*.safetensors")):
        raise LaquantError(f"{model_dir} has no .safetensors weights (laquant never loads pickle checkpoints)")
    config = model_config(cfg, model_dir)
    tokenizer = load_tokenizer(model_dir)
    hf_logging.disable_progress_bar()  # one bar per weight file is noise next to laquant's own
    try:
        model = get_family(config.model_type).model_class().from_pretrained(model_dir, config=config, dtype=dtype,
                                                                            use_safetensors=True)
    except Exception as exc:
        raise LaquantError(f"could not load weights from {model_dir}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    finally:
        hf_logging.enable_progress_bar()
    install(model)  # checks the layout; puts laquant's mixers in place in a hybrid
    return model.to(device).eval(), tokenizer
