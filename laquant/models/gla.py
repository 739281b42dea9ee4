"""GLA causal LM in flash-linear-attention's format, running on laquant's ops.

Parameter names, config fields and numerics follow fla's ``GLAForCausalLM`` (fla 0.6), so a
checkpoint written by fla loads here and vice versa. fla's own layers call Triton kernels that
need a GPU; this implementation calls :mod:`laquant.kernels`, which has a CPU path, and carries
the recurrent state in :class:`GLAStateCache` for incremental decoding.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from laquant.kernels.common.dispatch import use_triton
from laquant.kernels.common.numerics import ACT_GROUP
from laquant.kernels.gla.gate import gate_log_decay, gate_log_decay_triton, low_rank_gate_log_decay_triton
from laquant.kernels.rowwise.fused import MAX_ROW, gated_rms_norm_triton, group_rows_fit, rms_norm_triton
from laquant.kernels.rowwise.reference import gated_rms_norm, rms_norm
from laquant.models.cache import GLAStateCache
from laquant.models.fla_attention import Attention, attention_spec, attention_specs
from laquant.models.graphed_step import OUTPUT_CACHE_FIELD, graph_step_allowed, graphed_step
from laquant.models.recurrent import OutputNorm, RecurrentMixer
from laquant.models.side_stream import fork
from laquant.quant.fused import glu_project, low_rank_gate, project, w8a8_inputs
from laquant.serving.graphed_forward import graphed_logits

ATTN_INPUTS = ("q_proj", "k_proj", "v_proj", "g_proj")  # the projections that read the normed hidden state
MLP_INPUTS = ("gate_proj", "up_proj")


class GLAConfig(PretrainedConfig):
    model_type = "gla"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    def __init__(
        self,
        hidden_size: int = 2048,
        expand_k: float = 0.5,
        expand_v: float = 1.0,
        hidden_ratio: int | None = 4,
        intermediate_size: int | None = None,
        num_hidden_layers: int = 24,
        num_heads: int = 4,
        num_kv_heads: int | None = None,
        feature_map: str | None = None,
        attn_mode: str = "chunk",
        use_short_conv: bool = False,
        conv_size: int = 4,
        use_output_gate: bool = True,
        clamp_min: float | None = None,
        hidden_act: str = "swish",
        max_position_embeddings: int = 2048,
        elementwise_affine: bool | None = True,
        norm_eps: float = 1e-6,
        use_gk: bool = True,
        use_gv: bool = False,
        attn: dict | None = None,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        tie_word_embeddings: bool = False,
        initializer_range: float = 0.02,
        fuse_norm: bool = True,
        fuse_swiglu: bool = True,
        fuse_cross_entropy: bool = True,
        fuse_linear_cross_entropy: bool = False,
        use_l2warp: bool = False,
        vocab_size: int = 32000,
        attnres_block_size: int | None = None,
        **kwargs,
    ):
        self.hidden_size = hidden_size
        self.expand_k = expand_k
        self.expand_v = expand_v
        self.hidden_ratio = hidden_ratio
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.feature_map = feature_map
        self.attn_mode = attn_mode
        self.use_short_conv = use_short_conv
        self.conv_size = conv_size
        self.use_output_gate = use_output_gate
        self.clamp_min = clamp_min
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.elementwise_affine = elementwise_affine
        self.norm_eps = norm_eps
        self.use_gk = use_gk
        self.use_gv = use_gv
        self.attn = attn
        self.use_cache = use_cache
        self.initializer_range = initializer_range
        self.fuse_norm = fuse_norm
        self.fuse_swiglu = fuse_swiglu
        self.fuse_cross_entropy = fuse_cross_entropy
        self.fuse_linear_cross_entropy = fuse_linear_cross_entropy
        self.use_l2warp = use_l2warp
        self.vocab_size = vocab_size
        self.attnres_block_size = attnres_block_size
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )


# fla GLA options this implementation does not reproduce, with the value it supports. (fla 0.6's
# GatedMLP takes only swish or powlu and its GLA layer's output gate has no powlu: swish is the only
# hidden_act fla's GLA builds with. attnres_block_size: fla's attention residuals.)
_UNSUPPORTED = {
    "attnres_block_size": None,
    "hidden_act": "swish",
}
# fla's ACT2FN entries a GLA layer can apply to q and k (``feature_map``), in PyTorch
FEATURE_MAPS = {
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "logsigmoid": F.logsigmoid,
    "silu": F.silu,
    "swish": F.silu,
    "sqrelu": lambda x: F.relu(x.float()).square().to(x.dtype),
    "gelu": lambda x: (x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))).to(x.dtype),
}
# Numerically inert in fla 0.6's GLA (accepted, no effect on the logits): fuse_swiglu,
# fuse_cross_entropy, fuse_linear_cross_entropy and use_l2warp (fused kernels and training losses),
# attn_mode (kernels computing the same recurrence), use_gk / use_gv (fields its GLA layer is never
# given). fuse_norm=False keeps the numbers: fla then names the output norm g_norm and gates after
# it, and its block norms are torch's nn.RMSNorm (same parameters; laquant keeps its float32-statistics
# RMSNorm there, so bf16 results may differ from fla's by rounding).


def check_supported(config: GLAConfig) -> None:
    bad = [f"{key}={getattr(config, key, None)!r} (supported: {ok!r})" for key, ok in _UNSUPPORTED.items()
           if getattr(config, key, ok) != ok]
    try:
        attention_specs(config.attn, config.num_hidden_layers)
    except ValueError as exc:
        bad.append(f"attn: {exc}")
    if config.feature_map is not None and config.feature_map not in FEATURE_MAPS:
        bad.append(f"feature_map={config.feature_map!r} (supported: None, {', '.join(map(repr, FEATURE_MAPS))})")
    if bad:
        raise ValueError("this GLA config uses options laquant's GLA path does not implement: " + ", ".join(bad))


class RMSNorm(nn.Module):
    """fla's RMSNorm: statistics in float32, optional fused residual add (``prenorm``)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, prenorm: bool = False,
                round_sum: bool = False):
        """``round_sum``: normalize ``x + residual`` as rounded to x's dtype (a separate add's result)."""
        if use_triton(x) and x.shape[-1] <= MAX_ROW:
            out, summed = rms_norm_triton(x, self.weight, self.eps, residual, round_sum=round_sum)
        else:
            out, summed = rms_norm(x, self.weight, self.eps, residual, round_sum=round_sum)
        return (out, x if summed is None else summed) if prenorm else out

    def quantizing(self, x: torch.Tensor, packed, residual: torch.Tensor | None = None, round_sum: bool = False):
        """``(out, x + residual, codes)``: also the W8A8 codes of ``out`` for the GEMM of ``packed``
        (:func:`laquant.quant.fused.w8a8_inputs`), in the same kernel (GPU only)."""
        out, summed, codes = rms_norm_triton(x, self.weight, self.eps, residual, packed=packed, round_sum=round_sum)
        return out, (x if summed is None else summed), codes


class GatedRMSNorm(nn.Module):
    """fla's FusedRMSNormGated with swish: ``rmsnorm(x) * weight * silu(g)``, in float32 (no weight
    with ``elementwise_affine`` off)."""

    def __init__(self, hidden_size: int, eps: float, elementwise_affine: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size)) if elementwise_affine else None
        self.eps = eps

    def _weight(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight if self.weight is not None else x.new_ones(x.shape[-1], dtype=torch.float32)

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if use_triton(x) and x.shape[-1] <= MAX_ROW:
            return gated_rms_norm_triton(x, g, self._weight(x), self.eps)
        return gated_rms_norm(x, g, self._weight(x), self.eps)

    def quantizing(self, x: torch.Tensor, g: torch.Tensor, packed):
        """``(out, codes)`` over ``x [..., H, D]``: also the W8A8 codes of each token's ``H * D``
        outputs for the GEMM of ``packed``, in the same kernel (GPU only)."""
        return gated_rms_norm_triton(x, g, self._weight(x), self.eps, packed=packed)


class HeadRMSNorm(nn.Module):
    """fla's RMSNorm over each head's output (``g_norm``: no output gate, or the gate unfused):
    statistics and weight in float32, the result in x's dtype; no weight with ``elementwise_affine`` off."""

    def __init__(self, hidden_size: int, eps: float, elementwise_affine: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size)) if elementwise_affine else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float() if self.weight is not None else h).to(x.dtype)


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, hidden_ratio: int | None, intermediate_size: int | None):
        super().__init__()
        if intermediate_size is None:
            intermediate_size = int(hidden_size * (hidden_ratio or 4) * 2 / 3)
            intermediate_size = 256 * ((intermediate_size + 255) // 256)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, codes=None) -> torch.Tensor:
        """``codes``: x's W8A8 codes for the fused gate/up GEMM, made by the norm before it."""
        gate, up = project(self, MLP_INPUTS, x, codes)
        return glu_project(self, "down_proj", gate, up)


class GatedLinearAttention(RecurrentMixer):
    """fla's GatedLinearAttention, on laquant.kernels: GQA, optional short convs on q, k, v (silu, no
    bias), a feature map on q and k, the swish output gate fused into the norm (``fuse_norm``) or
    after it, or none."""

    gate_logit_normalizer = 16
    gate_low_rank_dim = 16

    def __init__(self, config: GLAConfig, layer_idx: int):
        super().__init__(layer_idx)
        hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads or config.num_heads
        self.num_kv_groups = self.num_heads // self.num_kv_heads
        self.key_dim = round(hidden * config.expand_k)
        self.value_dim = round(hidden * config.expand_v)
        if not (math.isclose(hidden * config.expand_k, self.key_dim)
                and math.isclose(hidden * config.expand_v, self.value_dim)):
            raise ValueError("hidden_size * expand_k and hidden_size * expand_v must be integers")
        if self.key_dim % self.num_heads or self.value_dim % self.num_heads:
            raise ValueError(f"key dim {self.key_dim} and value dim {self.value_dim} must divide by num_heads")
        self.head_k_dim = self.key_dim // self.num_heads
        self.head_v_dim = self.value_dim // self.num_heads
        kv_k, kv_v = self.key_dim // self.num_kv_groups, self.value_dim // self.num_kv_groups
        self.clamp_min = config.clamp_min
        self.feature_map = FEATURE_MAPS[config.feature_map] if config.feature_map is not None else None
        self.use_output_gate = config.use_output_gate
        self.fuse_norm_and_gate = config.use_output_gate and config.fuse_norm
        # the projections that read the normed hidden state (one fused GEMM where quantized alike)
        self.inputs = ATTN_INPUTS if config.use_output_gate else ATTN_INPUTS[:3]

        self.q_proj = nn.Linear(hidden, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_k, bias=False)
        self.v_proj = nn.Linear(hidden, kv_v, bias=False)
        if config.use_output_gate:
            self.g_proj = nn.Linear(hidden, self.value_dim, bias=False)
        self.use_short_conv = config.use_short_conv
        if config.use_short_conv:  # fla's ShortConvolution: depthwise, causal, silu, no bias
            for name, width in (("q_conv1d", self.key_dim), ("k_conv1d", kv_k), ("v_conv1d", kv_v)):
                setattr(self, name, nn.Conv1d(width, width, config.conv_size, groups=width,
                                              padding=config.conv_size - 1, bias=False))
        self.gk_proj = nn.Sequential(
            nn.Linear(hidden, self.gate_low_rank_dim, bias=False),
            nn.Linear(self.gate_low_rank_dim, kv_k, bias=True),
        )
        self.o_proj = nn.Linear(self.value_dim, hidden, bias=False)
        affine = bool(config.elementwise_affine)
        if self.fuse_norm_and_gate:
            self.g_norm_swish_gate = GatedRMSNorm(self.head_v_dim, eps=config.norm_eps, elementwise_affine=affine)
        else:
            self.g_norm = HeadRMSNorm(self.head_v_dim, eps=config.norm_eps, elementwise_affine=affine)

    def _heads(self, x: torch.Tensor, head_dim: int, shared_kv: bool = True) -> torch.Tensor:
        """``[..., H*D] -> [..., H, D]``; k, v and gates are shared across query groups (MQA/GQA)."""
        x = x.unflatten(-1, (-1, head_dim))
        return x.repeat_interleave(self.num_kv_groups, dim=-2) if shared_kv and self.num_kv_groups > 1 else x

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """Per-channel log-decay (<= 0) from the gate logits, as fla computes it (after the
        calibrated clamp and int8 rounding of an int8 gate's logits)."""
        gate = self.gk_proj
        treatment = gate.logit_treatment() if hasattr(gate, "logit_treatment") else {}
        pair = low_rank_gate(gate, x) if treatment else None
        if pair is not None:  # both int8 projections and the tail in one kernel
            return low_rank_gate_log_decay_triton(x, *pair, self.gate_logit_normalizer, self.clamp_min, **treatment)
        logits = gate.project(x) if treatment else gate(x)
        fn = gate_log_decay_triton if use_triton(logits) else gate_log_decay
        return fn(logits, self.gate_logit_normalizer, self.clamp_min, **treatment)

    def forward(self, x: torch.Tensor, cache: GLAStateCache | None = None, codes=None) -> torch.Tensor:
        """``codes``: x's W8A8 codes for the fused q/k/v(/g) GEMM, made by the norm before it."""
        gate = fork(self.log_decay, x)  # in a captured step, beside the q/k/v(/g) GEMM
        q, k, v, *g = project(self, self.inputs, x, codes)
        if self.use_short_conv:
            from laquant.models.hybrid_mixers import short_conv

            q, k, v = (short_conv(t, cache, (self.layer_idx, name), getattr(self, f"{name}_conv1d"), "silu")
                       for t, name in ((q, "q"), (k, "k"), (v, "v")))
        q = self._heads(q, self.head_k_dim, shared_kv=False)
        k = self._heads(k, self.head_k_dim)
        v = self._heads(v, self.head_v_dim)
        gk = self._heads(gate.join(), self.head_k_dim)
        if self.feature_map is not None:
            q, k = self.feature_map(q), self.feature_map(k)
        if not self.fuse_norm_and_gate:
            o = self.g_norm(self.attend_gla(q, k, v, gk, cache)).flatten(-2)
            return self.o_proj(o * F.silu(g[0]) if self.use_output_gate else o)

        g = g[0].unflatten(-1, (-1, self.head_v_dim))
        # per-group codes from the decode kernel: each head's V columns whole groups
        packed = w8a8_inputs(self, ("o_proj",), x, groups=self.head_v_dim % ACT_GROUP == 0)
        norm = self.g_norm_swish_gate
        out_norm = None  # a decode step's kernel applies the norm (a hooked norm runs as a module)
        if not (norm._forward_hooks or norm._forward_pre_hooks):
            out_norm = OutputNorm(g, norm._weight(g), norm.eps, packed)
        o = self.attend_gla(q, k, v, gk, cache, out_norm=out_norm)
        if out_norm is not None and out_norm.applied:
            if packed is not None:
                return project(self, ("o_proj",), o.flatten(-2), out_norm.codes)[0]
            return self.o_proj(o.flatten(-2))
        if packed is not None and (not packed.group or group_rows_fit(self.head_v_dim, packed.group)):
            o, codes = norm.quantizing(o, g, packed)
            return project(self, ("o_proj",), o.flatten(-2), codes)[0]
        return self.o_proj(norm(o, g).flatten(-2))


class GLABlock(nn.Module):
    def __init__(self, config: GLAConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        spec = attention_spec(config, layer_idx)  # fla's hybrid GLA: softmax attention at config.attn's layers
        self.attn = GatedLinearAttention(config, layer_idx) if spec is None else Attention(config.hidden_size, spec,
                                                                                           layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.hidden_ratio, config.intermediate_size)

    def forward(self, hidden: torch.Tensor, cache: GLAStateCache | None = None,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The block on ``hidden + residual`` (on ``hidden`` when ``residual`` is None), as fla's
        block computes it; returns ``(mlp_out, residual)``, whose sum is the block's output: the next
        block's first norm adds them in its kernel (rounded as the separate add would round them)."""
        # where the next GEMM is W8A8, the norm writes its int8 codes too (one kernel, no quantization pass)
        packed = w8a8_inputs(self.attn, self.attn.inputs, hidden, groups=True)
        if packed is not None:
            normed, residual, codes = self.attn_norm.quantizing(hidden, packed, residual, round_sum=True)
            hidden = self.attn(normed, cache, codes)
        else:
            normed, residual = self.attn_norm(hidden, residual, prenorm=True, round_sum=True)
            hidden = self.attn(normed, cache)
        packed = w8a8_inputs(self.mlp, MLP_INPUTS, hidden, groups=True)
        if packed is not None:
            hidden, residual, codes = self.mlp_norm.quantizing(hidden, packed, residual)
            return self.mlp(hidden, codes), residual
        hidden, residual = self.mlp_norm(hidden, residual, prenorm=True)
        return self.mlp(hidden), residual


class GLAPreTrainedModel(PreTrainedModel):
    config_class = GLAConfig
    base_model_prefix = "model"
    _no_split_modules = ["GLABlock"]
    _is_stateful = True

    def _apply(self, fn, recurse=True):
        # moved or cast (to(), cuda(), half(), ...): the weights get new storage, which captured graphs would not read
        from laquant.generate import release_all_graphs

        release_all_graphs(self)
        return super()._apply(fn, recurse)

    def _init_weights(self, module: nn.Module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, (RMSNorm, GatedRMSNorm, HeadRMSNorm)) and module.weight is not None:
            nn.init.ones_(module.weight)
        elif isinstance(module, nn.Conv1d):
            nn.init.normal_(module.weight, mean=0.0, std=std)


class GLAModel(GLAPreTrainedModel):
    def __init__(self, config: GLAConfig):
        check_supported(config)
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(GLABlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings

    def set_input_embeddings(self, value):
        self.embeddings = value

    def forward(self, input_ids: torch.LongTensor, cache: GLAStateCache | None = None) -> torch.Tensor:
        hidden, residual = self.embeddings(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(hidden, cache, residual)
        return self.norm(hidden, residual, round_sum=True)


class GLAForCausalLM(GLAPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}

    def __init__(self, config: GLAConfig):
        super().__init__(config)
        self.model = GLAModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embeddings

    def set_input_embeddings(self, value):
        self.model.embeddings = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def new_cache(self, seed: int = 0) -> GLAStateCache:
        return GLAStateCache(self.config.num_hidden_layers, seed)

    # generate(): the recurrent-state cache is made here, not as transformers' DynamicCache
    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, use_cache=True,
                                      cache=None, **kwargs) -> dict:
        # transformers' generate hands the cache over as `cache` from 5.24 on, as `past_key_values` before
        cache = _one_cache(cache, past_key_values)
        if use_cache and cache is None:
            cache = self.new_cache()
        if cache is not None:
            input_ids = input_ids[:, cache.seen_tokens:]  # only the tokens the state has not seen
        inputs = {"input_ids": input_ids, "cache": cache, "use_cache": use_cache, "logits_to_keep": 1}
        if attention_mask is not None and not bool(attention_mask[:, -input_ids.shape[1]:].all()):
            inputs["attention_mask"] = attention_mask  # a padded prompt (forward masks it); its decode steps need none
        # a decode step may replay a CUDA graph (laquant.models.graphed_step); laquant's own loops call forward without
        return {**inputs, "graph_step": True}

    def forward(
        self,
        input_ids: torch.LongTensor,
        labels: torch.LongTensor | None = None,
        cache: GLAStateCache | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        past_key_values: GLAStateCache | None = None,
        graph_step: bool = False,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """``cache`` (or, as transformers before 5.24 named it, ``past_key_values``) carries the
        recurrent state; with ``use_cache`` and none given, a fresh cache is made and returned, so
        ``model(ids[:, -1:], cache=out.cache)`` continues the sequence (``out.past_key_values`` before
        transformers 5.24). Labels are the inputs (shifted inside), as in transformers;
        ``logits_to_keep = n > 0`` computes the logits of the last ``n`` positions only. ``graph_step``
        (set by transformers' generate, through :meth:`prepare_inputs_for_generation`): a one-token step
        on CUDA replays a captured graph (:mod:`laquant.models.graphed_step`; same logits). A cacheless call
        (``use_cache`` off) replays a captured forward where ``laquant_graph_forward`` is on
        (:mod:`laquant.serving.graphed_forward`). ``attention_mask`` ``[B, S]`` (the last ``T`` columns this call's
        tokens, 0 at padding): a batch padded on the left or on the right runs as each sequence alone would
        (:meth:`padding_mask`), its logits at the padding meaningless."""
        cache = _one_cache(cache, past_key_values)
        mask = self.padding_mask(attention_mask, input_ids, cache)  # a padded call runs eagerly
        if mask is None and graph_step and graph_step_allowed(self, input_ids, cache, labels, logits_to_keep):
            logits = graphed_step(self, input_ids, cache)
            if logits is not None:
                return CausalLMOutputWithPast(logits=logits, **{OUTPUT_CACHE_FIELD: cache})
        if logits_to_keep and labels is not None:
            raise ValueError("logits_to_keep cannot be combined with labels (the loss needs every position)")
        logits = None if cache is not None or use_cache or mask is not None else graphed_logits(self, input_ids)
        if logits is not None:
            logits = logits[:, -logits_to_keep:] if logits_to_keep else logits
        else:
            if use_cache and cache is None:
                cache = self.new_cache()
            # the padding reaches the recurrent layers through a cache's token_mask (a cacheless call: one of its own)
            run = cache if cache is not None or mask is None else self.new_cache()
            if mask is not None:
                run.token_mask = mask
            try:
                hidden = self.model(input_ids, run)
            finally:
                if mask is not None:
                    run.token_mask = None
            logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{OUTPUT_CACHE_FIELD: cache})

    def padding_mask(self, attention_mask: torch.Tensor | None, input_ids: torch.Tensor, cache) -> torch.Tensor | None:
        """This call's padding (``[B, T]``, 0 at a padded token) where ``attention_mask`` pads any of its tokens, else
        None. Padding runs through the recurrent layers as no token at all (zero keys and log-decays, zero short-conv
        inputs, :class:`~laquant.models.cache.GLAStateCache`'s ``token_mask``), so it must start the sequences (a
        fresh cache) and sit before or after each one's tokens; softmax ``attn`` layers take none. Anything else is
        an error that says so, never a mask ignored."""
        if attention_mask is None:
            return None
        T = input_ids.shape[1]
        if attention_mask.dim() != 2 or attention_mask.shape[0] != input_ids.shape[0] or attention_mask.shape[1] < T:
            raise ValueError(f"attention_mask must be [batch, tokens] covering this call's {tuple(input_ids.shape)} "
                             f"tokens; got {tuple(attention_mask.shape)}")
        mask = attention_mask[:, -T:]
        if bool(mask.all()):
            return None
        if any(isinstance(layer.attn, Attention) for layer in self.model.layers):
            raise ValueError("a padded batch needs a model without softmax attn layers (their keys take no padding "
                             "mask here); run each prompt length as its own batch")
        if cache is not None and cache.seen_tokens:
            raise ValueError("padding must start the sequences: a padded call cannot continue a cache that has seen "
                             f"{cache.seen_tokens} tokens")
        mask = mask.bool()
        if not _padded_rows_ok(mask):
            raise ValueError("attention_mask must pad each sequence before or after its tokens, not between them")
        return mask


def _padded_rows_ok(mask: torch.Tensor) -> bool:
    """Whether each row of a 0/1 mask ``[B, T]`` is its real tokens then padding, or padding then its real tokens."""
    steps = (mask[:, 1:] != mask[:, :-1]).sum(-1)
    return bool((steps <= 1).all())


def _one_cache(cache, past_key_values):
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise ValueError("got two caches, `cache` and `past_key_values` (its name before transformers 5.24); "
                         "pass one")
    return cache if cache is not None else past_key_values


CONFIG_CLASS, MODEL_CLASS = GLAConfig, GLAForCausalLM  # read by laquant.families
