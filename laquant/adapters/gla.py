"""GLA (flash-linear-attention ``model_type: gla``) on laquant's implementation."""

from __future__ import annotations

import torch
import torch.nn as nn

from laquant.adapters.base import Adapter, MixerInfo
from laquant.errors import LaquantError
from laquant.kernels.gla.gate import gate_log_decay

MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


class GLAAdapter(Adapter):
    model_type = "gla"

    def __init__(self, model: nn.Module):
        super().__init__(model)
        from laquant.models.fla_attention import Attention
        from laquant.models.gla import GatedLinearAttention

        if not hasattr(model, "model") or not hasattr(model.model, "layers"):
            raise LaquantError("GLA adapter: expected a GLAForCausalLM with model.layers; "
                               f"got {type(model).__name__}")
        for i, layer in enumerate(model.model.layers):
            if not isinstance(layer.attn, (GatedLinearAttention, Attention)):
                raise LaquantError(f"GLA adapter: model.layers.{i}.attn is {type(layer.attn).__name__}, expected "
                                   "laquant's GatedLinearAttention or Attention (load the model with laquant.load_model)")
        self._softmax = {i for i, layer in enumerate(model.model.layers) if isinstance(layer.attn, Attention)}

    def _layers(self):
        """The GLA layers (fla's ``attn`` layers are softmax attention)."""
        return ((i, layer) for i, layer in enumerate(self.model.model.layers) if i not in self._softmax)

    def attention_projections(self) -> dict[str, nn.Module]:
        return {f"model.layers.{i}.attn.{p}": getattr(self.model.model.layers[i].attn, p)
                for i in sorted(self._softmax) for p in ("q_proj", "k_proj", "v_proj", "o_proj")}

    def projections(self) -> dict[str, nn.Module]:
        out = {}
        for i, layer in enumerate(self.model.model.layers):
            if i not in self._softmax:
                out.update({f"model.layers.{i}.attn.{p}": getattr(layer.attn, p)
                            for p in (*layer.attn.inputs, "o_proj")})
            out.update({f"model.layers.{i}.mlp.{p}": getattr(layer.mlp, p) for p in MLP_PROJECTIONS})
        return out

    def gates(self) -> dict[str, nn.Module]:
        return {f"model.layers.{i}.attn.gk_proj": layer.attn.gk_proj for i, layer in self._layers()}

    def mixers(self) -> dict[str, MixerInfo]:
        return {f"model.layers.{i}.attn": MixerInfo(f"model.layers.{i}.attn", i, layer.attn.num_heads,
                                                    layer.attn.head_k_dim, layer.attn.head_v_dim)
                for i, layer in self._layers()}

    def kept(self) -> dict[str, list[str]]:
        norms = [n for n, m in self.model.named_modules() if type(m).__name__ in ("RMSNorm", "GatedRMSNorm",
                                                                                 "HeadRMSNorm")]
        conv = [f"model.layers.{i}.attn.{p}_conv1d" for i, layer in self._layers() if layer.attn.use_short_conv
                for p in "qkv"]
        return {"embeddings": ["model.embeddings"], "norms": norms, "lm_head": ["lm_head"], "conv": conv}

    def decoder_layers(self) -> list[tuple[str, nn.Module]]:
        return [(f"model.layers.{i}", layer) for i, layer in enumerate(self.model.model.layers)]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.model.embeddings(ids)

    def run_layer(self, layer: nn.Module, hidden: torch.Tensor, cache) -> torch.Tensor:
        out, residual = layer(hidden, cache)
        return residual + out

    def head_modules(self) -> list[nn.Module]:
        return [self.model.model.norm, self.model.lm_head]

    def gate_log_decay(self, gate_name: str, logits: torch.Tensor) -> torch.Tensor:
        attn = self.module(gate_name.rpartition(".")[0])
        return gate_log_decay(logits, attn.gate_logit_normalizer, attn.clamp_min)


ADAPTER = GLAAdapter  # read by laquant.families
