"""fla's Gated DeltaNet (``model_type: gated_deltanet``) on laquant's implementation.

Roles: ``projections`` (q/k/v/b/g/o_proj and the MLPs), ``gates`` (``a_proj``: the decay logits),
``mixers`` (the delta-rule state, value heads x K x V), ``softmax_attention`` (fla's ``attn``
layers), kept: embeddings, norms, lm_head, the short convs and ``A_log`` / ``dt_bias``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from laquant.adapters.base import MixerInfo
from laquant.adapters.gla import MLP_PROJECTIONS, GLAAdapter
from laquant.errors import LaquantError


class GatedDeltaNetAdapter(GLAAdapter):
    model_type = "gated_deltanet"
    DECAY = ("A_log", "dt_bias")  # the mixer's decay parameters (fla's DeltaNet has none)

    @staticmethod
    def mixer_class() -> type[nn.Module]:
        from laquant.models.gated_deltanet import GatedDeltaNet

        return GatedDeltaNet

    def __init__(self, model: nn.Module):
        from laquant.models.fla_attention import Attention

        super(GLAAdapter, self).__init__(model)
        mixer = self.mixer_class()
        if not hasattr(model, "model") or not hasattr(model.model, "layers"):
            raise LaquantError(f"{self.model_type} adapter: expected a {mixer.__name__}ForCausalLM with model.layers; "
                               f"got {type(model).__name__}")
        for i, layer in enumerate(model.model.layers):
            if not isinstance(layer.attn, (mixer, Attention)):
                raise LaquantError(f"{self.model_type} adapter: model.layers.{i}.attn is {type(layer.attn).__name__}, "
                                   f"expected laquant's {mixer.__name__} or Attention (load the model with "
                                   "laquant.load_model)")
        self._softmax = {i for i, layer in enumerate(model.model.layers) if isinstance(layer.attn, Attention)}

    @staticmethod
    def _mixer_projections(attn) -> tuple[str, ...]:
        optional = [p for p in ("b_proj", "g_proj") if hasattr(attn, p)]  # fla's DeltaNet: use_beta, use_gate
        return ("q_proj", "k_proj", "v_proj", *optional, "o_proj")

    def projections(self) -> dict[str, nn.Module]:
        out = {}
        for i, layer in enumerate(self.model.model.layers):
            if i not in self._softmax:
                out.update({f"model.layers.{i}.attn.{p}": getattr(layer.attn, p)
                            for p in self._mixer_projections(layer.attn)})
            out.update({f"model.layers.{i}.mlp.{p}": getattr(layer.mlp, p) for p in MLP_PROJECTIONS})
        return out

    def gates(self) -> dict[str, nn.Module]:
        return {f"model.layers.{i}.attn.a_proj": layer.attn.a_proj for i, layer in self._layers()}

    def mixers(self) -> dict[str, MixerInfo]:
        return {f"model.layers.{i}.attn": MixerInfo(f"model.layers.{i}.attn", i, layer.attn.num_v_heads,
                                                    layer.attn.head_k_dim, layer.attn.head_v_dim)
                for i, layer in self._layers()}

    def kept(self) -> dict[str, list[str]]:
        norms = [n for n, m in self.model.named_modules() if isinstance(m, nn.Module) and "Norm" in type(m).__name__]
        layers = list(self._layers())
        conv = [f"model.layers.{i}.attn.{p}_conv1d" for i, layer in layers if layer.attn.use_short_conv for p in "qkv"]
        decay = [f"model.layers.{i}.attn.{p}" for i, _ in layers for p in self.DECAY]
        return {"embeddings": ["model.embeddings"], "norms": norms, "lm_head": ["lm_head"], "conv": conv,
                "decay": decay}

    def gate_log_decay(self, gate_name: str, logits: torch.Tensor) -> torch.Tensor:
        attn = self.module(gate_name.rpartition(".")[0])
        return attn.log_decay(logits.to(attn.A_log.device)).to(logits.device)


ADAPTER = GatedDeltaNetAdapter  # read by laquant.families
