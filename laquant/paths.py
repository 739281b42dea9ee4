"""Where models and outputs are, checked without torch or transformers: the CLI runs these before
its heavy imports, so a wrong path or an existing output is named at once. (``laquant.loading``
and ``laquant.checkpoint`` re-export them.)
"""

from __future__ import annotations

import json
import re
import tempfile
from importlib import resources
from pathlib import Path

from laquant.errors import LaquantError
from laquant.families import get_family

DEFAULT_MODEL_NAME = "gla-small"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# what a Hub download fetches: configs, weights, tokenizer, and a laquant checkpoint's recipe and remote code
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "recipe.yaml", "laquant_remote.py"]


def default_model_dir() -> Path:
    """The small trained GLA model shipped inside the package."""
    return Path(str(resources.files("laquant") / "assets" / DEFAULT_MODEL_NAME))


def resolve_model_dir(spec: str | Path | None) -> Path:
    """``None`` or ``"gla-small"`` (no such local folder) -> the embedded model; an existing
    directory -> itself; ``org/name`` -> the Hub cache."""
    if spec is None:
        return default_model_dir()
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if str(spec) == DEFAULT_MODEL_NAME:
        return default_model_dir()
    if path.exists():
        raise LaquantError(f"model path {spec} is a file; pass the model's directory (with config.json)")
    if _HUB_ID.match(str(spec)):
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(str(spec), allow_patterns=HUB_FILES))
        except Exception as exc:  # network, auth, missing repo: one clear line
            raise LaquantError(
                f"model {spec!r} is not a local directory and could not be fetched from the Hugging Face Hub "
                f"({type(exc).__name__}); download it first and pass the local directory"
            ) from None
    raise LaquantError(f"model directory not found: {spec}")


def read_config(model_dir: Path) -> dict:
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise LaquantError(f"{model_dir} has no config.json: is it a model directory?")
    try:
        return json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LaquantError(f"{cfg_path} is not valid JSON ({exc}); the checkpoint is corrupted") from None


def check_model_dir(spec: str | Path | None) -> Path:
    """The model's folder, with a readable config.json of a supported model type (transformers
    checks the rest of the config when the model loads)."""
    model_dir = resolve_model_dir(spec)
    cfg = read_config(model_dir)
    if not isinstance(cfg, dict):
        raise LaquantError(f"{model_dir / 'config.json'} is not a JSON object; the checkpoint is corrupted")
    get_family(cfg.get("model_type"), f"{model_dir}: model_type")
    return model_dir


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
