"""Quantized checkpoints: written to a temporary folder and moved into place; reloaded bit-exactly.

``OUT/`` holds ``model.safetensors`` (int8 weights, float32 scales, outlier indices, the rest in
the checkpoint's storage dtype) or, with ``max_shard_size``, ``model-0000i-of-0000n.safetensors``
shards and ``model.safetensors.index.json`` as transformers writes them; ``config.json`` with a
``quantization_config``, ``recipe.yaml``, ``stats.safetensors``, the tokenizer files,
``report.md``, and ``laquant.json``: the sha256 of every file written (and of the
quantization_config), checked on load (:mod:`laquant.integrity`). No pickle anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from laquant.errors import LaquantError
from laquant.paths import check_out_dir  # noqa: F401  (re-exported: checked before torch loads)

QUANT_METHOD = "laquant"
FORMAT_VERSION = 1
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
# config.json fields that only steer loading (laquant.hf_integration.finish_checkpoint writes them):
# where transformers expects the weights' file name, a sentence plain transformers refuses to load
# by; and an auto_map to the remote-code module shipped beside the weights
NO_LAQUANT_GUARD = ("this is a laquant checkpoint: `pip install laquant` and `import laquant` before from_pretrained "
                    "(or pass trust_remote_code=True with laquant installed); without laquant its quantized "
                    "layers would load as random weights")
REMOTE_CODE_MODULE = "laquant_remote"


def without_loader_fields(cfg: dict) -> dict:
    """``cfg`` (a config.json dict) without the guard and laquant's auto_map entries: the model's own config."""
    cfg = {k: v for k, v in cfg.items() if not (k == "transformers_weights" and v in (NO_LAQUANT_GUARD, None))}
    auto_map = {k: v for k, v in (cfg.get("auto_map") or {}).items()
                if not str(v).startswith(f"{REMOTE_CODE_MODULE}.")}
    if auto_map:
        cfg["auto_map"] = auto_map
    else:
        cfg.pop("auto_map", None)
    return cfg


def storage_tensor(t: torch.Tensor, storage_dtype: torch.dtype) -> torch.Tensor:
    """Float tensors go to the storage dtype where that loses nothing (weights that came from a
    bf16 checkpoint); scales and anything else that would round keep their dtype."""
    t = t.detach().cpu().contiguous()
    if t.is_floating_point() and t.dtype != storage_dtype and t.element_size() > 1:
        cast = t.to(storage_dtype)
        if torch.equal(cast.to(t.dtype), t):
            return cast
    return t


class StagingDir:
    """``with StagingDir(out, overwrite) as tmp:`` fill ``tmp``; on success it replaces ``out``."""

    def __init__(self, out: Path, overwrite: bool):
        self.out, self.overwrite = Path(out), overwrite

    def __enter__(self) -> Path:
        check_out_dir(self.out, self.overwrite)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.partial-", dir=self.out.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        umask = os.umask(0)
        os.umask(umask)
        self.tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result should not be
        for f in self.tmp.iterdir():
            f.chmod(0o666 & ~umask)
        old = None
        if self.out.exists():
            old = self.out.with_name(f".{self.out.name}.old-{os.getpid()}")
            self.out.rename(old)
        self.tmp.rename(self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return False


def save_quantized(model, out: Path, recipe: dict, decisions, stats=None, tokenizer=None,
                   report: str | None = None, overwrite: bool = False,
                   storage_dtype: torch.dtype = torch.bfloat16, max_shard_size: int | str | None = None,
                   entries=None) -> Path:
    """``entries``: the weights as :func:`write_tensors` takes them, when ``model`` does not hold
    them (a model streamed layer by layer, :mod:`laquant.streaming`); default: ``model``'s state."""
    from laquant.hf_integration import finish_checkpoint
    from laquant.recipe import recipe_to_yaml

    out = Path(out)
    with StagingDir(out, overwrite) as tmp:
        if entries is None:
            stored = write_weights(model, tmp, storage_dtype, max_shard_size)
        else:
            stored = write_tensors(entries, tmp, storage_dtype, max_shard_size)
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        # the dtype of the checkpoint's float weights (the base model's: bf16 for a bf16 model),
        # which transformers' dtype="auto" and lm-eval then compute in, as they do for the base model;
        # laquant.load and from_pretrained without a dtype compute in float32
        config["dtype"] = str(stored).removeprefix("torch.")
        config["quantization_config"] = {
            "quant_method": QUANT_METHOD, "format_version": FORMAT_VERSION,
            "recipe": recipe, "decisions": decisions if isinstance(decisions, dict) else decisions.to_dict(),
        }
        encode = getattr(model.config, "_encode_special_floats", None)  # inf/nan as transformers writes them
        (tmp / "config.json").write_text(json.dumps(encode(config) if encode else config, indent=2) + "\n")
        (tmp / "recipe.yaml").write_text(recipe_to_yaml(recipe))
        if stats is not None:
            stats.save(tmp / "stats.safetensors")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if report is not None:
            (tmp / "report.md").write_text(report)
        finish_checkpoint(tmp, config["model_type"])  # the no-laquant guard, remote code, digests: last
    return out


def parse_size(size: int | str) -> int:
    """``5GB`` / ``500MB`` / ``2GiB`` / bytes -> bytes (decimal units as transformers reads them)."""
    if isinstance(size, int):
        n = size
    else:
        units = {"TIB": 2**40, "GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "TB": 10**12, "GB": 10**9, "MB": 10**6,
                 "KB": 10**3, "B": 1}
        text = str(size).strip().upper().replace(" ", "")
        unit = next((u for u in units if text.endswith(u)), None)
        try:
            n = int(float(text[: -len(unit)] if unit else text) * (units[unit] if unit else 1))
        except ValueError:
            raise LaquantError(f"shard size {size!r} is not a size; use e.g. 5GB, 500MB or a number of bytes") from None
    if n <= 0:
        raise LaquantError(f"shard size {size!r} must be positive")
    return n


def write_weights(model, folder: Path, storage_dtype: torch.dtype, max_shard_size: int | str | None = None):
    """The state dict (a tensor used under several names once, :func:`unique_state`) into
    ``model.safetensors`` or, past ``max_shard_size``, into shards named and indexed as
    transformers' ``save_pretrained`` does. One shard's tensors are held at a time.
    Returns the storage dtype of the float parameters (``storage_dtype`` unless one would round)."""
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    entries = ((name, t, name in params) for name, t in unique_state(model).items())
    return write_tensors(entries, folder, storage_dtype, max_shard_size)


def write_tensors(entries, folder: Path, storage_dtype: torch.dtype, max_shard_size: int | str | None = None):
    """:func:`write_weights` of ``(name, tensor, is_parameter)`` in state-dict order, each stored once,
    consumed one at a time (one shard's tensors are held)."""
    from safetensors.torch import save_file

    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    # one key: safetensors writes the metadata in hash order, so a second key made the bytes of each
    # save differ (config.json's quantization_config says what quantized the weights)
    metadata = {"format": "pt"}
    shards, shard, shard_bytes, total = [], {}, 0, 0
    kept_dtype = storage_dtype
    for name, tensor, is_param in entries:
        t = storage_tensor(tensor, storage_dtype)
        if is_param and t.is_floating_point() and t.dtype != storage_dtype:
            kept_dtype = t.dtype
        size = t.numel() * t.element_size()
        if limit is not None and shard and shard_bytes + size > limit:
            shards.append(_write_shard(save_file, shard, folder, len(shards), metadata))
            shard, shard_bytes = {}, 0
        shard[name], shard_bytes, total = t, shard_bytes + size, total + size
    if limit is None or not shards:
        save_file(shard, str(folder / WEIGHTS_NAME), metadata=metadata)
        return kept_dtype
    shards.append(_write_shard(save_file, shard, folder, len(shards), metadata))
    weight_map = {}
    for i, (tmp_name, names) in enumerate(shards):
        final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        (folder / tmp_name).rename(folder / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / WEIGHTS_INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return kept_dtype


def _write_shard(save_file, shard: dict, folder: Path, i: int, metadata: dict) -> tuple[str, list[str]]:
    name = f".shard-{i}.safetensors"  # renamed once the number of shards is known
    save_file(shard, str(folder / name), metadata=metadata)
    return name, list(shard)


def weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's weight files: the shards its index names, or ``model.safetensors``."""
    model_dir = Path(model_dir)
    index = model_dir / WEIGHTS_INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise LaquantError(f"{index} is not a valid safetensors index (no weight_map); "
                               "the checkpoint is corrupted") from None
        if any(not isinstance(n, str) or Path(n).name != n for n in names):
            raise LaquantError(f"{index} names weight files outside the checkpoint folder; the checkpoint is corrupted")
        files = [model_dir / n for n in names]
        for f in files:
            if not f.is_file():
                raise LaquantError(f"weights shard {f.name} named in {index.name} is missing from {model_dir}; "
                                   "copy the whole checkpoint folder")
        return files
    single = model_dir / WEIGHTS_NAME
    if not single.is_file():
        raise LaquantError(f"checkpoint weights not found: {single} (nor {WEIGHTS_INDEX_NAME})")
    return [single]


def read_quantization_config(model_dir: Path) -> dict | None:
    from laquant.loading import read_config

    qcfg = read_config(Path(model_dir)).get("quantization_config")
    if qcfg is None:
        return None
    if qcfg.get("quant_method") != QUANT_METHOD:
        raise LaquantError(f"{model_dir} is quantized with {qcfg.get('quant_method')!r}, not by laquant")
    if qcfg.get("format_version") != FORMAT_VERSION or "decisions" not in qcfg:
        raise LaquantError(f"{model_dir}: unsupported laquant checkpoint format {qcfg.get('format_version')!r} "
                           f"(this laquant reads version {FORMAT_VERSION})")
    return qcfg


def unique_state(model) -> dict[str, torch.Tensor]:
    """The model's state dict with each tensor under its first name only: one used under several
    names (a block shared by several layers, tied embeddings) is stored once; loading fills all."""
    seen, out = set(), {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            out[name] = t
    return out


def _targets(model) -> dict[str, torch.Tensor]:
    """The model's parameters and persistent buffers by state-dict name (tied ones under each
    name), as the tensors themselves, to copy a checkpoint into."""
    out = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        prefix = f"{prefix}." if prefix else ""
        for name, p in module._parameters.items():
            if p is not None:
                out[prefix + name] = p
        for name, b in module._buffers.items():
            if b is not None and name not in module._non_persistent_buffers_set:
                out[prefix + name] = b
    return out


@torch.no_grad()
def fill_model(model, model_dir: Path) -> None:
    """Copy the checkpoint's weights (one file, or its shards) into ``model`` one tensor at a time
    (peak memory: the model plus its largest tensor, not a second copy of it); every key and
    shape must match."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    expected = _targets(model)
    aliases: dict[int, list[str]] = {}  # a tensor under several names is stored under one of them
    for name, target in expected.items():
        aliases.setdefault(id(target), []).append(name)
    located = {}
    for path in weight_files(model_dir):
        with _reading(path):
            with safe_open(str(path), framework="pt") as f:
                located.update(dict.fromkeys(f.keys(), path))
    missing = [names[0] for names in aliases.values() if not any(n in located for n in names)]
    unexpected = [k for k in located if k not in expected]
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {sorted(unexpected)[:3]}"
        raise LaquantError(f"{model_dir} does not match its quantization_config ({what}); "
                           "the checkpoint is corrupted")
    for path in dict.fromkeys(located.values()):
        with _reading(path):
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    t, target = f.get_tensor(name), expected[name]
                    if t.shape != target.shape:
                        raise LaquantError(f"{model_dir}: tensor {name} has shape {tuple(t.shape)}, "
                                           f"expected {tuple(target.shape)}")
                    target.copy_(t)


class _reading:
    """Errors while reading a safetensors file become one LaquantError naming it."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or isinstance(exc, (LaquantError, KeyboardInterrupt)):
            return False
        raise LaquantError(f"{self.path} is corrupted or truncated ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}); re-create the checkpoint") from None
