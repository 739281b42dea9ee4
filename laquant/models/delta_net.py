"""DeltaNet causal LM in flash-linear-attention's format (``model_type: delta_net``), on laquant's ops.

Parameter names, config fields and numerics follow fla 0.6's ``DeltaNetForCausalLM``
(fla/models/delta_net, fla/layers/delta_net.py), so an fla checkpoint loads without fla installed.
The delta rule without a decay: laquant's gated delta rule with ``g = 0``. A layer: q, k, v
projections (widths ``hidden_size * expand_k`` / ``expand_v``), each through a short conv (silu on
q and k only with ``qk_activation: silu``; always on v), or the activations alone without
``use_short_conv``; then ``qk_activation`` (relu, elu + 1, identity) and ``qk_norm`` (l2 per head,
in the kernels; or ``sum``: divided by the sum), ``beta = sigmoid(b_proj(x))`` (1 without
``use_beta``), and an RMSNorm per head (gated by ``g_proj`` with swish under ``use_gate``) before
``o_proj``. Blocks, MLP and fla's ``attn`` softmax layers are Gated DeltaNet's (laquant's GLA's).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig

from laquant.models.fla_attention import refuse_unsupported
from laquant.models.gated_deltanet import (GatedDeltaNetForCausalLM, GatedDeltaNetModel, GatedDeltaNetPreTrainedModel,
                                           GatedOutputNorm)
from laquant.models.gla import HeadRMSNorm
from laquant.models.recurrent import RecurrentMixer


class DeltaNetConfig(PretrainedConfig):
    model_type = "delta_net"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    def __init__(self, attn_mode: str = "chunk", hidden_size: int = 2048, expand_k: float = 1.0, expand_v: float = 1.0,
                 use_gate: bool = False, use_short_conv: bool = True, conv_size: int = 4, use_beta: bool = True,
                 use_output_norm: bool = True, num_heads: int = 16, qk_norm: str = "l2", qk_activation: str = "silu",
                 max_position_embeddings: int = 2048, hidden_ratio: int | None = 4, intermediate_size: int | None = None,
                 hidden_act: str = "swish", num_hidden_layers: int = 24, norm_eps: float = 1e-6,
                 attn: dict | list | None = None, use_cache: bool = True, pad_token_id: int | None = None,
                 bos_token_id: int = 1, eos_token_id: int = 2, tie_word_embeddings: bool = False,
                 initializer_range: float = 0.02, fuse_norm: bool = True, fuse_swiglu: bool = True,
                 fuse_cross_entropy: bool = True, use_l2warp: bool = False, vocab_size: int = 32000, **kwargs):
        self.attn_mode, self.hidden_size, self.expand_k, self.expand_v = attn_mode, hidden_size, expand_k, expand_v
        self.use_gate, self.use_short_conv, self.conv_size, self.use_beta = use_gate, use_short_conv, conv_size, use_beta
        self.use_output_norm = use_output_norm  # inert: fla 0.6's layer normalises the output either way
        self.num_heads, self.qk_norm, self.qk_activation = num_heads, qk_norm, qk_activation
        self.max_position_embeddings = max_position_embeddings
        self.hidden_ratio, self.intermediate_size, self.hidden_act = hidden_ratio, intermediate_size, hidden_act
        self.num_hidden_layers, self.norm_eps, self.attn, self.use_cache = num_hidden_layers, norm_eps, attn, use_cache
        self.initializer_range = initializer_range
        self.fuse_norm, self.fuse_swiglu, self.fuse_cross_entropy = fuse_norm, fuse_swiglu, fuse_cross_entropy
        self.use_l2warp, self.vocab_size = use_l2warp, vocab_size
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)


QK_ACTIVATIONS = {"silu": F.silu, "relu": F.relu, "elu": lambda x: F.elu(x, 1.0) + 1.0, "identity": lambda x: x}
QK_NORMS = ("l2", "sum")


def check_supported(config: DeltaNetConfig) -> None:
    """ValueError naming the options laquant does not implement, or widths fla would refuse."""
    bad = []
    if config.hidden_act != "swish":
        bad.append(f"hidden_act={config.hidden_act!r} (supported: 'swish')")
    if config.qk_activation not in QK_ACTIVATIONS:
        bad.append(f"qk_activation={config.qk_activation!r} (supported: {', '.join(QK_ACTIVATIONS)})")
    if config.qk_norm not in QK_NORMS:
        bad.append(f"qk_norm={config.qk_norm!r} (supported: {', '.join(QK_NORMS)})")
    for name in ("expand_k", "expand_v"):
        width = int(config.hidden_size * getattr(config, name))
        if width % config.num_heads:
            bad.append(f"{name}={getattr(config, name)!r} (hidden_size * {name} = {width} does not split into "
                       f"{config.num_heads} heads)")
    refuse_unsupported("delta_net", config, bad)


class DeltaNet(RecurrentMixer):
    def __init__(self, config: DeltaNetConfig, layer_idx: int):
        super().__init__(layer_idx)
        hidden = config.hidden_size
        self.num_heads = self.num_v_heads = config.num_heads
        self.key_dim, self.value_dim = int(hidden * config.expand_k), int(hidden * config.expand_v)
        self.head_k_dim, self.head_v_dim = self.key_dim // self.num_heads, self.value_dim // self.num_heads
        self.use_gate, self.use_short_conv, self.use_beta = config.use_gate, config.use_short_conv, config.use_beta
        self.qk_activation, self.qk_norm = config.qk_activation, config.qk_norm
        self.q_proj = nn.Linear(hidden, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.value_dim, bias=False)
        if config.use_beta:
            self.b_proj = nn.Linear(hidden, self.num_heads, bias=False)
        if config.use_short_conv:
            for name, width in (("q_conv1d", self.key_dim), ("k_conv1d", self.key_dim), ("v_conv1d", self.value_dim)):
                setattr(self, name, nn.Conv1d(width, width, config.conv_size, groups=width,
                                              padding=config.conv_size - 1, bias=False))
        if config.use_gate:
            self.g_proj = nn.Linear(hidden, self.value_dim, bias=False)
            self.o_norm = GatedOutputNorm(self.head_v_dim, config.norm_eps, "swish")
        else:
            self.o_norm = HeadRMSNorm(self.head_v_dim, config.norm_eps)
        self.o_proj = nn.Linear(self.value_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        silu_qk = self.qk_activation == "silu"
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.use_short_conv:
            from laquant.models.hybrid_mixers import short_conv

            q, k, v = (short_conv(t, cache, (self.layer_idx, name), getattr(self, f"{name}_conv1d"),
                                  "silu" if silu_qk or name == "v" else None)
                       for t, name in ((q, "q"), (k, "k"), (v, "v")))
        else:
            v = F.silu(v)
            if silu_qk:
                q, k = F.silu(q), F.silu(k)
        q, k = q.unflatten(-1, (-1, self.head_k_dim)), k.unflatten(-1, (-1, self.head_k_dim))
        if not silu_qk:
            q, k = QK_ACTIVATIONS[self.qk_activation](q), QK_ACTIVATIONS[self.qk_activation](k)
        if self.qk_norm == "sum":
            q, k = q / q.sum(-1, keepdim=True), k / k.sum(-1, keepdim=True)
        beta = self.b_proj(x).float().sigmoid() if self.use_beta else x.new_ones(*x.shape[:-1], self.num_heads).float()
        no_decay = x.new_zeros(*x.shape[:-1], self.num_heads, dtype=torch.float32)
        o = self.attend_delta(q, k, v.unflatten(-1, (-1, self.head_v_dim)), no_decay, beta, cache,
                              use_qk_l2norm=self.qk_norm == "l2")
        o = self.o_norm(o, self.g_proj(x).unflatten(-1, (-1, self.head_v_dim))) if self.use_gate else self.o_norm(o)
        return self.o_proj(o.flatten(-2).to(x.dtype))


class DeltaNetPreTrainedModel(GatedDeltaNetPreTrainedModel):
    config_class = DeltaNetConfig


class DeltaNetModel(DeltaNetPreTrainedModel, GatedDeltaNetModel):
    mixer_class = DeltaNet
    check_supported = staticmethod(check_supported)


class DeltaNetForCausalLM(DeltaNetPreTrainedModel, GatedDeltaNetForCausalLM):
    """fla's DeltaNetForCausalLM; forward, cache and generation as laquant's GLA."""

    decoder_class = DeltaNetModel


CONFIG_CLASS, MODEL_CLASS = DeltaNetConfig, DeltaNetForCausalLM  # read by laquant.families
