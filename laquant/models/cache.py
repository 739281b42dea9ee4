"""Recurrent-state cache for incremental decoding of linear-attention models."""

from __future__ import annotations

import torch


class GLAStateCache:
    """One recurrent state ``[B, H, K, V]`` (float32) per layer, plus the number of tokens seen.

    Unlike a KV cache it does not grow with the sequence: a linear-attention layer's whole memory
    of the past is its state.
    """

    def __init__(self, num_layers: int):
        self.states: list[torch.Tensor | None] = [None] * num_layers
        self.seen_tokens = 0

    def get(self, layer_idx: int) -> torch.Tensor | None:
        return self.states[layer_idx]

    def update(self, layer_idx: int, state: torch.Tensor, new_tokens: int) -> None:
        self.states[layer_idx] = state
        if layer_idx == len(self.states) - 1:
            self.seen_tokens += new_tokens

    def __len__(self) -> int:
        return sum(s is not None for s in self.states)

    def state_bytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.states if s is not None)
