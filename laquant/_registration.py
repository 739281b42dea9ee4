"""laquant's registrations with transformers (model_type "gla" for the Auto classes, the "laquant"
quantization method), made without importing transformers before anything needs it.

``import laquant`` calls :func:`register_with_transformers`: if transformers is imported already,
laquant registers at once; otherwise a one-shot import hook (the post-import-hook pattern of
``wrapt.register_post_import_hook``) registers right after transformers' own ``__init__`` has run,
so ``import laquant`` followed by ``from transformers import AutoModelForCausalLM`` works as if
laquant had imported transformers itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_TARGET = "transformers"


def _register() -> None:
    import laquant.hf_integration  # noqa: F401  (the quantization config and quantizer)
    import laquant.models  # noqa: F401  (model_type "gla")


class _Loader(importlib.abc.Loader):
    """transformers' own loader, then laquant's registrations; it hands the module back to that
    loader, so nothing of the hook stays on transformers."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        spec = module.__spec__
        spec.loader = module.__loader__ = self.loader
        self.loader.exec_module(module)
        _register()


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        _remove_hook()
        spec = importlib.util.find_spec(fullname)  # the ordinary finders
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RegisterAfterImport)]


def register_with_transformers() -> None:
    if _TARGET in sys.modules:
        _register()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
