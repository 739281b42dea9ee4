"""Recurrent-state cache for incremental decoding of linear-attention models."""

from __future__ import annotations

import torch

from laquant.kernels.common.state import State


class GLAStateCache:
    """One recurrent state ``[B, H, K, V]`` per layer in the layer's storage format, plus the
    number of tokens seen. Unlike a KV cache it does not grow: a linear-attention layer's whole
    memory of the past is its state."""

    def __init__(self, num_layers: int):
        self.states: list[State | None] = [None] * num_layers
        self.seen_tokens = 0

    def get(self, layer_idx: int) -> State | None:
        return self.states[layer_idx]

    def update(self, layer_idx: int, stored: State, new_tokens: int) -> None:
        self.states[layer_idx] = stored
        if layer_idx == len(self.states) - 1:
            self.seen_tokens += new_tokens

    def __len__(self) -> int:
        return sum(s is not None for s in self.states)

    def state_bytes(self) -> int:
        return sum(s.nbytes() for s in self.states if s is not None)


class HybridStates:
    """The recurrent (and short-conv) states of a transformers hybrid's linear layers, kept beside
    transformers' own cache (whose KV layers serve the softmax-attention layers). Stored in
    laquant's formats, so they do not depend on how a transformers version lays out its cache."""

    def __init__(self):
        self.states: dict[int, State] = {}
        self.conv: dict[int, torch.Tensor] = {}
        self.seen_tokens = 0

    def get(self, layer_idx: int) -> State | None:
        return self.states.get(layer_idx)

    def update(self, layer_idx: int, stored: State, new_tokens: int) -> None:
        self.states[layer_idx] = stored

    def state_bytes(self) -> int:
        return sum(s.nbytes() for s in self.states.values())


def state_store(cache) -> GLAStateCache | HybridStates | None:
    """Where the linear layers keep their states for ``cache``: a :class:`GLAStateCache` is its own
    store; any other (transformers) cache gets a :class:`HybridStates` attached on first use."""
    if cache is None or isinstance(cache, GLAStateCache):
        return cache
    store = getattr(cache, "laquant_states", None)
    if store is None:
        store = HybridStates()
        cache.laquant_states = store
    return store
