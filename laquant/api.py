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
    # laquant.calibrate_streamed: the model is on the meta device; this reads, quantizes and writes its
    # layers when save() asks (laquant.streaming.WeightStream)
    stream: object = None


def calibrate(model, recipe: dict | str, data: torch.Tensor | None = None, stats: Stats | None = None,
              samples: int = 128, seq_len: int = 2048, seed: int = 0, progress: bool = True,
              layerwise_device: str | torch.device | None = None, on_units=None) -> Calibrated:
    """Quantize ``model`` in place with ``recipe`` (a name, path or validated dict).

    ``data``: a 1-D token tensor (random windows are drawn from it) or ``[N, L]`` batches. Pass
    ``stats`` instead to reuse statistics from an earlier run. ``layerwise_device``: calibrate one
    decoder layer at a time on that device while the model stays where it is (see
    :func:`~laquant.calibration.run.collect_stats`). ``on_units(n)``: called with the calibration
    tokens done, for a progress display.
    """
    recipe = load_recipe(recipe) if isinstance(recipe, str) else recipe
    recipe = for_family(recipe, model.config.model_type)
    adapter = install(model)  # a transformers hybrid loaded without laquant gets laquant's mixers here
    if stats is None:
        if data is None:
            raise LaquantError("calibrate needs calibration data (token ids) or saved stats")
        batches = data if data.dim() == 2 else calibration_batches(data, samples, seq_len, seed)
        stats = collect_stats(model, adapter, batches, seed=seed, progress=progress,
                              layerwise_device=layerwise_device, on_units=on_units)
    elif stats.meta.get("model_type") != model.config.model_type:
        raise LaquantError(f"the statistics were collected on a {stats.meta.get('model_type')!r} model, "
                           f"not {model.config.model_type!r}")
    decisions = plan(adapter, stats, recipe)
    apply(model, adapter, decisions, stats)
    _record_quantization(model, recipe, decisions.to_dict())
    return Calibrated(model, recipe, decisions, stats)


def _record_quantization(model, recipe: dict, decisions: dict) -> None:
    from laquant.hf_integration import mark_quantized

    mark_quantized(model, recipe, decisions)


def save(result: Calibrated, out: str | Path, tokenizer=None, report: str | None = None,
         overwrite: bool = False, max_shard_size: int | str | None = None, progress: bool = False) -> Path:
    """Write the checkpoint folder; ``max_shard_size`` (``"5GB"``, bytes) splits the weights into
    shards with a ``model.safetensors.index.json``, as transformers' ``save_pretrained`` does. A
    streamed result (:func:`laquant.calibrate_streamed`) is quantized layer by layer here, once;
    ``progress``: its bar."""
    entries = None
    if result.stream is not None:
        entries = result.stream.quantized_entries(result, get_adapter(result.model), progress)
    return save_quantized(result.model, Path(out), result.recipe, result.decisions, result.stats, tokenizer,
                          report, overwrite, max_shard_size=max_shard_size, entries=entries)


def load(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | str = torch.float32,
         verify: bool | None = None):
    """A laquant checkpoint (or a plain model) as ``(model, tokenizer)``, in eval mode.

    ``dtype="auto"``: the dtype config.json names (the base model's). ``verify``: check the files
    against the digests in ``laquant.json`` (default: yes, unless ``LAQUANT_NO_VERIFY=1``); False
    skips reading every file twice, for very large models."""
    from laquant.integrity import verify_checkpoint
    from laquant.loading import (config_dtype, empty_model, load_model, load_tokenizer, read_supported_config,
                                 resolve_model_dir)

    model_dir = resolve_model_dir(path)
    qcfg = read_quantization_config(model_dir)
    cfg = read_supported_config(model_dir)
    dtype = config_dtype(cfg) if dtype == "auto" else dtype
    if qcfg is None:
        return load_model(model_dir, device=device, dtype=dtype)
    verify_checkpoint(model_dir, verify)
    model = empty_model(cfg, model_dir, dtype)
    build_empty(model, get_adapter(model), qcfg["decisions"])
    fill_model(model, model_dir)
    _record_quantization(model, qcfg["recipe"], qcfg["decisions"])
    return model.to(device).eval(), load_tokenizer(model_dir)
