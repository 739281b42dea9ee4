"""Quantization recipes, one YAML file each. Loading and validation live in :mod:`laquant.recipe`."""

from importlib import resources
from pathlib import Path


def recipe_dir() -> Path:
    return Path(str(resources.files(__name__)))
