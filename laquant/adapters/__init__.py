"""Architecture adapters: which modules of a model play which role.

Roles: ``projections`` (ordinary ``nn.Linear``), ``gates`` (gate projections), ``mixers``
(linear-attention layers holding a recurrent state), ``softmax_attention``, and what is kept in
high precision (``embeddings``, ``norms``, ``lm_head``; in hybrids also ``routers``, ``experts``,
``conv``, ``decay``). Recipes speak in roles only.
"""

from __future__ import annotations

from laquant.adapters.base import Adapter, MixerInfo
from laquant.adapters.gla import GLAAdapter
from laquant.adapters.hybrid import HYBRID_ADAPTERS, new_cache
from laquant.errors import LaquantError

ADAPTERS: dict[str, type[Adapter]] = {"gla": GLAAdapter, **HYBRID_ADAPTERS}


def get_adapter(model) -> Adapter:
    model_type = getattr(model.config, "model_type", None)
    if model_type not in ADAPTERS:
        raise LaquantError(f"no laquant adapter for model_type {model_type!r}; supported: {', '.join(ADAPTERS)}")
    return ADAPTERS[model_type](model)


__all__ = ["ADAPTERS", "Adapter", "MixerInfo", "get_adapter", "new_cache"]
