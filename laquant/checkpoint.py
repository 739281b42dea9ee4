"""Quantized checkpoints: written to a temporary folder and moved into place; reloaded bit-exactly.

``OUT/`` holds ``model.safetensors`` (int8 weights, float32 scales, outlier indices, the rest in
the checkpoint's storage dtype), ``config.json`` with a ``quantization_config``, ``recipe.yaml``,
``stats.safetensors``, the tokenizer files and ``report.md``. No pickle anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from laquant.errors import LaquantError

QUANT_METHOD = "laquant"
FORMAT_VERSION = 1


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Before any work: ``out`` can be made here (a folder, new or empty or to be replaced, whose
    nearest existing parent folder takes new entries)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LaquantError(f"output {out} is a file, not a folder; pass a folder path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise LaquantError(f"output {out} exists and is not empty; pass --overwrite to replace it")
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise LaquantError(f"output {out} cannot be made: {parent} is a file")
    try:  # what the staging folder will do there
        tempfile.TemporaryDirectory(dir=parent, prefix=f".{out.name}.probe-").cleanup()
    except OSError as exc:
        raise LaquantError(f"output {out} cannot be written: {parent} does not take new folders "
                           f"({exc.strerror or type(exc).__name__}); choose another --out") from None


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
                   storage_dtype: torch.dtype = torch.bfloat16) -> Path:
    from safetensors.torch import save_file

    from laquant.recipe import recipe_to_yaml

    out = Path(out)
    with StagingDir(out, overwrite) as tmp:
        state = {k: storage_tensor(v, storage_dtype) for k, v in unique_state(model).items()}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt", "quant_method": QUANT_METHOD})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        # the compute dtype the model was saved in: from_pretrained then rebuilds it bit for bit
        config["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
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
    return out


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
def fill_model(model, path: Path, source: Path) -> None:
    """Copy the checkpoint file ``path`` into ``model`` one tensor at a time (peak memory: the model
    plus its largest tensor, not a second copy of it); every key and shape must match."""
    from safetensors import safe_open

    if not path.is_file():
        raise LaquantError(f"checkpoint weights not found: {path}")
    expected = _targets(model)
    aliases: dict[int, list[str]] = {}  # a tensor under several names is stored under one of them
    for name, target in expected.items():
        aliases.setdefault(id(target), []).append(name)
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            missing = [names[0] for names in aliases.values() if not any(n in keys for n in names)]
            unexpected = [k for k in keys if k not in expected]
            if missing or unexpected:
                what = f"missing {missing[:3]}" if missing else f"unexpected {sorted(unexpected)[:3]}"
                raise LaquantError(f"{source} does not match its quantization_config ({what}); "
                                   "the checkpoint is corrupted")
            for names in aliases.values():
                name = next(n for n in names if n in keys)
                target = expected[name]
                t = f.get_tensor(name)
                if t.shape != target.shape:
                    raise LaquantError(f"{source}: tensor {name} has shape {tuple(t.shape)}, "
                                       f"expected {tuple(target.shape)}")
                target.copy_(t)
    except LaquantError:
        raise
    except Exception as exc:
        raise LaquantError(f"{path} is corrupted or truncated ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                           "re-create the checkpoint") from None
