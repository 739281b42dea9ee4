"""What more than one command needs: the device choice, atomic writes, version stamps."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from laquant.errors import LaquantError


def pick_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise LaquantError("--device cuda was asked for, but no CUDA device is available; use --device cpu")
    return requested


def versions() -> dict:
    import torch
    import transformers

    import laquant

    out = {"laquant": laquant.__version__, "torch": torch.__version__, "transformers": transformers.__version__}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def add_to_folder(folder: Path, files: dict[str, str], build=None) -> None:
    """Add files (and whatever ``build(tmp)`` writes) to an existing folder, each moved in whole."""
    with tempfile.TemporaryDirectory(dir=folder, prefix=".partial-") as tmp:
        tmp = Path(tmp)
        for name, text in files.items():
            (tmp / name).write_text(text)
        if build is not None:
            build(tmp)
        for item in tmp.iterdir():
            target = folder / item.name
            if target.is_dir():
                shutil.rmtree(target)
            item.replace(target)
