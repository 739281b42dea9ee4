"""Evaluation and calibration text: shipped local copies, text files, or `datasets` ids."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from laquant.errors import LaquantError

# Named datasets: the shipped local copy, and the Hugging Face id it is a copy of.
NAMED = {
    "wikitext2": ("data/wikitext-2-raw/wiki.test.raw", ("wikitext", "wikitext-2-raw-v1", "test")),
    # exllamav2's standard calibration text (MIT): Wikipedia, C4, TinyStories, technical prose
    "calibration": ("data/calibration/*.utf8", None),
}


def _asset(rel: str) -> Path:
    return Path(str(resources.files("laquant") / "assets" / rel))


def load_text(spec: str) -> str:
    """``wikitext2`` (shipped copy), a path to a UTF-8 text file, or ``DATASET_ID[:CONFIG]`` (test split)."""
    if spec in NAMED:
        local, _ = NAMED[spec]
        folder, _, pattern = local.rpartition("/")
        return "\n\n".join(_read_file(p) for p in sorted(_asset(folder).glob(pattern)))
    path = Path(spec).expanduser()
    if path.exists() or path.suffix or spec.startswith((".", "/", "~")):
        return _read_file(path)
    return _load_dataset_text(spec)


def _read_file(path: Path) -> str:
    if path.is_dir():
        raise LaquantError(f"data path {path} is a directory; pass a text file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LaquantError(f"data file not found: {path} (use 'wikitext2', a text file, or a datasets id)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LaquantError(f"cannot read data file {path}: {exc}") from None
    if not text.strip():
        raise LaquantError(f"data file {path} is empty")
    return text


def _load_dataset_text(spec: str, split: str = "test") -> str:
    try:
        import datasets
    except ImportError:
        raise LaquantError(f"--data {spec} names a `datasets` id, but `datasets` is not installed: "
                           "pip install 'laquant[datasets]', or pass a local text file") from None
    name, _, config = spec.partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split=split)
    except Exception as exc:
        raise LaquantError(f"could not load dataset {spec!r} ({type(exc).__name__}); pass a local text file") from None
    if "text" not in ds.column_names:
        raise LaquantError(f"dataset {spec!r} has no 'text' column (columns: {', '.join(ds.column_names)})")
    return "\n\n".join(ds["text"])


def tokenize(text: str, tokenizer) -> torch.Tensor:
    """The whole text as one 1-D LongTensor of token ids (no special tokens added)."""
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)
