"""Gated DeltaNet causal LM in flash-linear-attention's format (``model_type: gated_deltanet``), on
laquant's ops.

Parameter names, config fields and numerics follow fla 0.6's ``GatedDeltaNetForCausalLM``
(fla/models/gated_deltanet, fla/layers/gated_deltanet.py), so an fla checkpoint loads here without
fla installed, as ``gla`` does. A layer: q, k, v projections, each through a short conv with silu
(or a silu alone without ``use_short_conv``), q and k l2-normalised per head, the gated delta rule
with ``g = -exp(A_log) * softplus(a_proj(x) + dt_bias)`` and ``beta = sigmoid(b_proj(x))`` (doubled
with ``allow_neg_eigval``), value heads grouped over the q/k heads (``num_v_heads``), then an RMSNorm
gated by ``g_proj`` (``output_gate_activation``: swish or sigmoid; no gate without ``use_gate``) and
``o_proj``. Blocks, MLP and fla's ``attn`` softmax layers are those of laquant's GLA.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel

from laquant.models.fla_attention import Attention, attention_spec, refuse_unsupported
from laquant.models.gla import GatedMLP, GLAForCausalLM, GLAPreTrainedModel, HeadRMSNorm, RMSNorm
from laquant.models.recurrent import RecurrentMixer


class GatedDeltaNetConfig(PretrainedConfig):
    model_type = "gated_deltanet"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    def __init__(self, attn_mode: str = "chunk", hidden_size: int = 2048, expand_v: float = 2.0, use_gate: bool = True,
                 use_short_conv: bool = True, allow_neg_eigval: bool = False, conv_size: int = 4, head_dim: int = 256,
                 num_heads: int = 6, num_v_heads: int | None = None, max_position_embeddings: int = 2048,
                 hidden_ratio: int | None = 4, intermediate_size: int | None = None, hidden_act: str = "swish",
                 num_hidden_layers: int = 21, norm_eps: float = 1e-6, attn: dict | list | None = None,
                 use_cache: bool = True, pad_token_id: int | None = None, bos_token_id: int = 1, eos_token_id: int = 2,
                 tie_word_embeddings: bool = False, initializer_range: float = 0.02, fuse_norm: bool = True,
                 fuse_swiglu: bool = True, fuse_cross_entropy: bool = True, fuse_linear_cross_entropy: bool = False,
                 use_l2warp: bool = False, vocab_size: int = 32000, attnres_block_size: int | None = None,
                 output_gate_activation: str = "swish", **kwargs):
        self.attn_mode, self.hidden_size, self.expand_v = attn_mode, hidden_size, expand_v
        self.use_gate, self.output_gate_activation = use_gate, output_gate_activation
        self.use_short_conv, self.allow_neg_eigval, self.conv_size = use_short_conv, allow_neg_eigval, conv_size
        self.head_dim, self.num_heads, self.num_v_heads = head_dim, num_heads, num_v_heads
        self.max_position_embeddings = max_position_embeddings
        self.hidden_ratio, self.intermediate_size, self.hidden_act = hidden_ratio, intermediate_size, hidden_act
        self.num_hidden_layers, self.norm_eps, self.attn, self.use_cache = num_hidden_layers, norm_eps, attn, use_cache
        self.initializer_range = initializer_range
        self.fuse_norm, self.fuse_swiglu, self.fuse_cross_entropy = fuse_norm, fuse_swiglu, fuse_cross_entropy
        self.fuse_linear_cross_entropy, self.use_l2warp = fuse_linear_cross_entropy, use_l2warp
        self.vocab_size, self.attnres_block_size = vocab_size, attnres_block_size
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)


# fla_core's activations for the output gate (swish and silu are one)
OUTPUT_GATES = {"swish": F.silu, "silu": F.silu, "sigmoid": torch.sigmoid}


def check_supported(config: GatedDeltaNetConfig) -> None:
    """ValueError naming the options laquant does not implement (fla's inert flags are accepted:
    fuse_*, use_l2warp, attn_mode)."""
    bad = []
    if config.attnres_block_size is not None:
        bad.append(f"attnres_block_size={config.attnres_block_size!r} (supported: None)")
    if config.hidden_act != "swish":
        bad.append(f"hidden_act={config.hidden_act!r} (supported: 'swish')")
    if config.output_gate_activation not in OUTPUT_GATES:
        bad.append(f"output_gate_activation={config.output_gate_activation!r} (supported: {', '.join(OUTPUT_GATES)})")
    refuse_unsupported("gated_deltanet", config, bad)


class GatedOutputNorm(HeadRMSNorm):
    """fla's FusedRMSNormGated: ``rmsnorm(x) * weight * act(g)``, in float32."""

    def __init__(self, hidden_size: int, eps: float, activation: str):
        super().__init__(hidden_size, eps)
        self.activation = OUTPUT_GATES[activation]

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return (super().forward(x.float()) * self.activation(g.float())).to(x.dtype)


class GatedDeltaNet(RecurrentMixer):
    def __init__(self, config: GatedDeltaNetConfig, layer_idx: int):
        super().__init__(layer_idx)
        hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.num_v_heads = config.num_v_heads or config.num_heads
        self.head_k_dim = config.head_dim
        self.head_v_dim = int(config.head_dim * config.expand_v)
        if not math.isclose(config.head_dim * config.expand_v, self.head_v_dim, rel_tol=1e-5):
            raise ValueError(f"head_dim * expand_v = {config.head_dim * config.expand_v} is not an integer")
        if self.num_v_heads % self.num_heads:
            raise ValueError(f"num_v_heads={self.num_v_heads} must be a multiple of num_heads={self.num_heads}")
        self.key_dim, self.value_dim = self.num_heads * self.head_k_dim, self.num_v_heads * self.head_v_dim
        self.use_gate, self.use_short_conv = config.use_gate, config.use_short_conv
        self.allow_neg_eigval = config.allow_neg_eigval

        self.q_proj = nn.Linear(hidden, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.value_dim, bias=False)
        self.a_proj = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.b_proj = nn.Linear(hidden, self.num_v_heads, bias=False)
        # fla's initialisation (a checkpoint overwrites it)
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads, dtype=torch.float32).uniform_(0, 16).log())
        dt = torch.exp(torch.rand(self.num_v_heads) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        if config.use_short_conv:  # fla's ShortConvolution: depthwise, causal, silu, no bias
            for name, width in (("q_conv1d", self.key_dim), ("k_conv1d", self.key_dim), ("v_conv1d", self.value_dim)):
                setattr(self, name, nn.Conv1d(width, width, config.conv_size, groups=width,
                                              padding=config.conv_size - 1, bias=False))
        if config.use_gate:
            self.g_proj = nn.Linear(hidden, self.value_dim, bias=False)
            self.o_norm = GatedOutputNorm(self.head_v_dim, config.norm_eps, config.output_gate_activation)
        else:
            self.o_norm = HeadRMSNorm(self.head_v_dim, config.norm_eps)
        self.o_proj = nn.Linear(self.value_dim, hidden, bias=False)

    def log_decay(self, a: torch.Tensor) -> torch.Tensor:
        return -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.use_short_conv:
            from laquant.models.hybrid_mixers import short_conv

            q, k, v = (short_conv(t, cache, (self.layer_idx, name), getattr(self, f"{name}_conv1d"), "silu")
                       for t, name in ((q, "q"), (k, "k"), (v, "v")))
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        beta = self.b_proj(x).float().sigmoid()
        if self.allow_neg_eigval:
            beta = beta * 2.0
        o = self.attend_delta(q.unflatten(-1, (-1, self.head_k_dim)), k.unflatten(-1, (-1, self.head_k_dim)),
                              v.unflatten(-1, (-1, self.head_v_dim)), self.log_decay(self.a_proj(x)), beta, cache)
        if self.use_gate:
            o = self.o_norm(o, self.g_proj(x).unflatten(-1, (-1, self.head_v_dim)))
        else:
            o = self.o_norm(o)
        return self.o_proj(o.flatten(-2).to(x.dtype))


class GatedDeltaNetBlock(nn.Module):
    def __init__(self, config: GatedDeltaNetConfig, layer_idx: int, mixer: type[nn.Module] = GatedDeltaNet):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        spec = attention_spec(config, layer_idx)  # fla's hybrid: softmax attention at config.attn's layers
        self.attn = mixer(config, layer_idx) if spec is None else Attention(config.hidden_size, spec, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.hidden_ratio, config.intermediate_size)

    def forward(self, hidden: torch.Tensor, cache=None) -> torch.Tensor:
        residual = hidden
        hidden = self.attn(self.attn_norm(hidden), cache)
        hidden, residual = self.mlp_norm(hidden, residual, prenorm=True)
        return residual + self.mlp(hidden)


class GatedDeltaNetPreTrainedModel(GLAPreTrainedModel):
    config_class = GatedDeltaNetConfig
    _no_split_modules = ["GatedDeltaNetBlock"]


class GatedDeltaNetModel(GatedDeltaNetPreTrainedModel):
    mixer_class = GatedDeltaNet  # fla's DeltaNet (laquant.models.delta_net) shares the rest of the model
    check_supported = staticmethod(check_supported)

    def __init__(self, config: GatedDeltaNetConfig):
        self.check_supported(config)
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(GatedDeltaNetBlock(config, i, self.mixer_class)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings

    def set_input_embeddings(self, value):
        self.embeddings = value

    def forward(self, input_ids: torch.LongTensor, cache=None) -> torch.Tensor:
        hidden = self.embeddings(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, cache)
        return self.norm(hidden)


class GatedDeltaNetForCausalLM(GatedDeltaNetPreTrainedModel, GLAForCausalLM):
    """fla's GatedDeltaNetForCausalLM; forward, cache and generation as laquant's GLA."""

    decoder_class = GatedDeltaNetModel

    def __init__(self, config: GatedDeltaNetConfig):
        PreTrainedModel.__init__(self, config)
        self.model = self.decoder_class(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


CONFIG_CLASS, MODEL_CLASS = GatedDeltaNetConfig, GatedDeltaNetForCausalLM  # read by laquant.families
