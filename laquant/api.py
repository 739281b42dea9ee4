"""The Python API: ``laquant.calibrate``, ``laquant.save``, ``laquant.load``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from laquant.adapters import get_adapter, install
from laquant.calibration.run import calibration_batches, collect_stats
from laquant.calibration.stats import Stats
from laquant.checkpoint import fill_model, read_quantization_config, save_quantized
from laquant.errors import LaquantError
from laquant.decisions import Decisions
from laquant.quantize import apply, build_empty, plan
from laquant.recipe import for_family, load_recipe


@dataclass
class Calibrated:
    """What :func:`calibrate` returns: the quantized model and how it got there."""

    model: torch.nn.Module
    recipe: dict
    decisions: Decisions
    stats: Stats


def calibrate(model, recipe: dict | str, data: torch.Tensor | None = None, stats: Stats | None = None,
              samples: int = 128, seq_len: int = 2048, seed: int = 0, progress: bool = True,
              layerwise_device: str | torch.device | None = None) -> Calibrated:
    """Quantize ``model`` in place with ``recipe`` (a name, path or validated dict).

    ``data``: a 1-D token tensor (random windows are drawn from it) or ``[N, L]`` batches. Pass
    ``stats`` instead to reuse statistics from an earlier run. ``layerwise_device``: calibrate one
    decoder layer at a time on that device while the model stays where it is (see
    :func:`~laquant.calibration.run.collect_stats`).
    """
    recipe = load_recipe(recipe) if isinstance(recipe, str) else recipe
    recipe = for_family(recipe, model.config.model_type)
    adapter = install(model)  # a transformers hybrid loaded without laquant gets laquant's mixers here
    if stats is None:
        if data is None:
            raise LaquantError("calibrate needs calibration data (token ids) or saved stats")
        batches = data if data.dim() == 2 else calibration_batches(data, samples, seq_len, seed)
        stats = collect_stats(model, adapter, batches, seed=seed, progress=progress,
                              layerwise_device=layerwise_device)
    elif stats.meta.get("model_type") != model.config.model_type:
        raise LaquantError(f"the statistics were collected on a {stats.meta.get('model_type')!r} model, "
                           f"not {model.config.model_type!r}")
    decisions = plan(adapter, stats, recipe)
    apply(model, adapter, decisions, stats)
    _record_quantization(model, recipe, decisions.to_dict())
    return Calibrated(model, recipe, decisions, stats)


def _record_quantization(model, recipe: dict, decisions: dict) -> None:
    """Keep the recipe and decisions on the model's config, so that transformers' ``save_pretrained``
    writes a checkpoint that reloads as quantized (without them it would reload as an unquantized
    model with missing weights)."""
    from laquant.hf_integration import LaquantConfig

    model.config.quantization_config = LaquantConfig(recipe=recipe, decisions=decisions)


def save(result: Calibrated, out: str | Path, tokenizer=None, report: str | None = None,
         overwrite: bool = False) -> Path:
    return save_quantized(result.model, Path(out), result.recipe, result.decisions, result.stats, tokenizer,
                          report, overwrite)


def load(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """A laquant checkpoint (or a plain model) as ``(model, tokenizer)``, in eval mode."""
    from laquant.loading import empty_model, load_model, load_tokenizer, read_supported_config, resolve_model_dir

    model_dir = resolve_model_dir(path)
    qcfg = read_quantization_config(model_dir)
    if qcfg is None:
        return load_model(model_dir, device=device, dtype=dtype)
    model = empty_model(read_supported_config(model_dir), model_dir, dtype)
    build_empty(model, get_adapter(model), qcfg["decisions"])
    fill_model(model, model_dir / "model.safetensors", model_dir)
    _record_quantization(model, qcfg["recipe"], qcfg["decisions"])
    return model.to(device).eval(), load_tokenizer(model_dir)
