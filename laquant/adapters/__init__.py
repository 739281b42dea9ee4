"""Architecture adapters: which modules of a model play which role.

Roles: ``projections`` (ordinary ``nn.Linear``), ``gates`` (gate projections), ``mixers``
(linear-attention layers holding a recurrent state), ``softmax_attention``, and what is kept in
high precision (``embeddings``, ``norms``, ``lm_head``; in hybrids also ``routers``, ``experts``,
``conv``, ``decay``). Recipes speak in roles only. Which adapter a model gets is its family's
(:mod:`laquant.families`).
"""

from __future__ import annotations

import functools
import inspect

from laquant.adapters.base import Adapter, MixerInfo
from laquant.errors import LaquantError


def get_adapter(model) -> Adapter:
    """The adapter of ``model``: reads and checks its layout, changes nothing."""
    from laquant.families import FAMILIES

    model_type = getattr(model.config, "model_type", None)
    if model_type not in FAMILIES:
        raise LaquantError(f"no laquant adapter for model_type {model_type!r}; supported: {', '.join(FAMILIES)}")
    return FAMILIES[model_type].adapter(model)


def install(model) -> Adapter:
    """Put laquant's modules in place in ``model`` (a hybrid's linear-attention mixers; idempotent)
    and return its adapter."""
    adapter = get_adapter(model)
    adapter.install()
    return adapter


def new_cache(model, seed: int = 0):
    """A fresh cache for ``model`` (laquant's GLA or a transformers hybrid): what its forward takes
    for incremental decoding (:func:`cache_kwargs`). ``seed`` keys a stochastically rounded state's
    random bits."""
    from laquant.models.cache import check_seed, state_store

    if hasattr(model, "new_cache"):
        return model.new_cache(seed)
    cache = get_adapter(model).new_cache()
    store = state_store(cache)
    if store is not None:
        store.seed = check_seed(seed)
    return cache


def cache_kwargs(model, cache) -> dict:
    """``{keyword: cache}``, the keyword ``model``'s forward takes its cache by: ``cache`` (laquant's GLA,
    and transformers from 5.24 on, where ``past_key_values`` is deprecated, to go in 5.40),
    ``cache_params`` (transformers' Mamba-2 models before 5.24) or ``past_key_values`` (the others before 5.24)."""
    return {_cache_keyword(type(model)): cache}


@functools.lru_cache(maxsize=None)
def _cache_keyword(cls) -> str:
    from laquant.models.cache import CACHE_KEYWORDS

    params = inspect.signature(cls.forward).parameters
    return next((name for name in CACHE_KEYWORDS[:-1] if name in params), CACHE_KEYWORDS[-1])


def returned_cache(out):
    """The cache a forward returned: ``out.cache`` from transformers 5.24 on, ``out.cache_params`` (Mamba-2
    models) or ``out.past_key_values`` before (read as keys: the deprecated attribute logs a warning)."""
    from laquant.models.cache import CACHE_KEYWORDS

    name = next((name for name in CACHE_KEYWORDS[:-1] if name in out), CACHE_KEYWORDS[-1])
    return out.get(name)  # not `or`: an empty transformers cache is falsy


__all__ = ["Adapter", "MixerInfo", "cache_kwargs", "get_adapter", "install", "new_cache", "returned_cache"]
