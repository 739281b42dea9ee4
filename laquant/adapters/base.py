"""The interface every architecture adapter implements."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass(frozen=True)
class MixerInfo:
    """A linear-attention layer and its state layout: ``num_heads`` states of ``[head_k, head_v]``."""

    name: str
    layer_idx: int
    num_heads: int
    head_k: int
    head_v: int


class Adapter:
    model_type: str = ""

    def __init__(self, model: nn.Module):
        self.model = model

    def install(self) -> None:
        """Put laquant's modules in place in the model (idempotent). Building an adapter only
        reads the model; this is the one step that changes it before quantization."""

    def projections(self) -> dict[str, nn.Linear]:
        raise NotImplementedError

    def gates(self) -> dict[str, nn.Module]:
        raise NotImplementedError

    def gate_channels(self, name: str) -> tuple[int, int] | None:
        """``(first, count)`` when the gate is a slice of a fused projection's outputs; None: all of them."""
        return None

    def attention_projections(self) -> dict[str, nn.Module]:
        """The q/k/v/o projections of softmax-attention layers (none in a pure linear-attention model)."""
        return {}

    def mixers(self) -> dict[str, MixerInfo]:
        raise NotImplementedError

    def kept(self) -> dict[str, list[str]]:
        """Role -> module names kept in high precision (embeddings, norms, lm_head; hybrids add
        routers, experts, conv and decay parameters)."""
        raise NotImplementedError

    def new_cache(self):
        """A fresh cache for incremental decoding."""
        return self.model.new_cache()

    def gate_log_decay(self, gate_name: str, logits: torch.Tensor) -> torch.Tensor:
        """The log-decay a gate's logits turn into (for statistics)."""
        raise NotImplementedError

    # Layer-by-layer execution (calibration with one decoder layer on the device at a time)
    def decoder_layers(self) -> list[tuple[str, nn.Module]]:
        """The decoder layers in order, as ``(name, module)``."""
        raise NotImplementedError

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> the first layer's input."""
        raise NotImplementedError

    def run_layer(self, layer: nn.Module, hidden: torch.Tensor, cache) -> torch.Tensor:
        """One decoder layer on ``hidden``, its recurrent state carried in ``cache``. Adapters that do
        not define it are calibrated layer by layer with the layers onloaded by hooks instead."""
        raise NotImplementedError

    def head_modules(self) -> list[nn.Module]:
        """What runs after the last layer (final norm, lm_head), in order."""
        raise NotImplementedError

    def module(self, name: str) -> nn.Module:
        return self.model.get_submodule(name)

    def replace(self, name: str, new: nn.Module) -> None:
        parent, _, child = name.rpartition(".")
        setattr(self.model.get_submodule(parent) if parent else self.model, child, new)
