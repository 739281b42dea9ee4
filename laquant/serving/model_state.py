"""Where a model keeps what a prefix-cache snapshot holds, for the two kinds of model laquant runs.

* laquant's own models (``GLAForCausalLM``, ``GatedDeltaNetForCausalLM``, ``DeltaNetForCausalLM``): one
  :class:`~laquant.models.cache.GLAStateCache` holds the mixers' states, the short convs' last
  inputs and fla's ``attn`` layers' keys and values ``[B, T, H, D]``.
* transformers' hybrids (every family of :mod:`laquant.families` with laquant's mixers installed):
  the linear layers keep their states and conv inputs in the
  :class:`~laquant.models.cache.HybridStates` store attached to transformers' cache
  (:func:`~laquant.models.cache.state_store`), which also counts the tokens the positions continue
  from; the softmax layers' keys and values ``[B, H, T, D]`` are in that cache's per-layer objects
  (transformers 5.x: ``cache.layers[i].keys`` / ``.values``, written through ``cache.update``).
  Only the plain growing layers are read: a sliding-window or quantized KV layer does not keep
  every token's keys, so a model whose cache has one is refused.
"""

from __future__ import annotations

import torch

from laquant.adapters import new_cache
from laquant.errors import LaquantError


class NativeLayout:
    """laquant's GLA / Gated DeltaNet / DeltaNet: everything in one :class:`GLAStateCache`."""

    seq_dim = 1  # fla's attn layers keep [B, T, H, D]

    def __init__(self, model):
        from laquant.models.fla_attention import Attention
        from laquant.models.recurrent import RecurrentMixer

        self.model, self.name = model, type(model).__name__
        self.mixers = {}
        for i, layer in enumerate(model.model.layers):
            mixer = layer.attn
            if not isinstance(mixer, (RecurrentMixer, Attention)):  # a recurrent mixer writes the checkpoints
                raise LaquantError(f"the prefix state cache does not know the mixer {type(mixer).__name__} of "
                                   f"{self.name}")
            if not isinstance(mixer, Attention):
                self.mixers[i] = mixer
        self.has_attention = bool(model.config.attn)

    def kv(self, cache) -> dict:
        return cache.kv

    def put_kv(self, cache, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        cache.kv[layer] = (k, v)


class HybridLayout:
    """A transformers hybrid: states in the attached :class:`HybridStates`, KV in transformers' cache."""

    seq_dim = -2  # transformers' KV layers keep [B, H, T, D]

    def __init__(self, model, adapter):
        from transformers import cache_utils

        def layer_types(*names):  # the ones this transformers has (DummyLayer is new in 5.2x)
            return tuple(getattr(cache_utils, n) for n in names if hasattr(cache_utils, n))

        self.model, self.name = model, type(model).__name__
        self.mixers = {m.layer_idx: m for m in (adapter.mixer(i) for i in adapter.linear_layers())}
        self.has_attention = bool(adapter.attention_layers())
        # exact types: growing, every token
        self.kv_layers = layer_types("DynamicLayer", "LinearAttentionAndFullAttentionLayer")
        known = (*self.kv_layers, *layer_types("LinearAttentionLayer", "DummyLayer"))
        cache = new_cache(model)
        if not hasattr(cache, "layers") or not hasattr(cache, "update"):
            raise LaquantError(f"the prefix state cache reads transformers' per-layer cache objects (cache.layers); "
                               f"{self.name}'s cache {type(cache).__name__} has none (another transformers version)")
        for i, layer in enumerate(cache.layers):
            if type(layer) not in known:
                raise LaquantError(f"the prefix state cache does not cover {self.name}: its cache layer {i} is "
                                   f"{type(layer).__name__}, which does not keep every token's keys and values "
                                   f"(covered: {', '.join(t.__name__ for t in known)})")

    def kv(self, cache) -> dict:
        out = {}
        for i, layer in enumerate(cache.layers):
            keys = getattr(layer, "keys", None)
            if keys is None or keys.numel() == 0:
                continue
            if type(layer) not in self.kv_layers:  # a layer made after the check at construction
                raise LaquantError(f"the prefix state cache cannot snapshot {self.name}'s cache layer {i} "
                                   f"({type(layer).__name__}): not a plain growing KV layer")
            out[i] = (keys, layer.values)
        return out

    def put_kv(self, cache, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        cache.update(k, v, layer)


def vocab_size(model) -> int:
    """The vocabulary of ``model`` (a vision-language model's is its text config's)."""
    return model.config.get_text_config().vocab_size


def model_layout(model):
    """The layout of ``model`` (a LaquantError naming what is covered when it is neither kind)."""
    from laquant.families import FAMILIES
    from laquant.models.gla import GLAForCausalLM

    name = type(model).__name__
    if isinstance(model, GLAForCausalLM):  # GatedDeltaNetForCausalLM and DeltaNetForCausalLM are ones
        return NativeLayout(model)
    family = FAMILIES.get(getattr(getattr(model, "config", None), "model_type", None))
    if family is None or family.native:
        hybrids = [t for t, f in FAMILIES.items() if not f.native]
        raise LaquantError(f"the prefix state cache covers laquant's own models (GLAForCausalLM, "
                           f"GatedDeltaNetForCausalLM) and transformers' hybrids with laquant's mixers installed "
                           f"({', '.join(hybrids)}), not {name}")
    from laquant.adapters import get_adapter

    return HybridLayout(model, get_adapter(model))
