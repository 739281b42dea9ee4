"""The gated softmax-attention layers of Qwen3-Next and Qwen3.5 on a static decode step, in four
launches around the attention where q, k and v run as one GEMM.

transformers' forward of these layers is about 55 launches for a decode token: the q, k and v
projections, the copy of the output gate out of ``q_proj``'s interleaved layout, the q and k
RMSNorms (~10 launches each), the partial rotary embedding of q and k (~6 each), the two
``index_copy_`` of the cache update, the attention, ``sigmoid(gate)``, its product and ``o_proj``.
On a step of :class:`~laquant.models.static_hybrid.StaticHybridCache` (the graphed decode loops)
:func:`install`'s forward runs instead:

* the q, k and v projections as one GEMM where they are quantized alike
  (:func:`~laquant.quant.fused.project`; W8A8 on the codes the input norm wrote);
* :func:`~laquant.kernels.attention.qk_norm_rope.qk_norm_rope_step_triton`: the norms, the rotary
  embedding and the cache write, reading q, the gate, k and v in place;
* the static steps' attention (:func:`~laquant.models.static_hybrid.static_decode_attention`, as registered);
* ``o * sigmoid(gate)`` as one kernel that writes ``o_proj``'s W8A8 codes where it is W8A8.

Its roundings are transformers' (the norms' float32 formula with one rounding, each rotary product
and sum rounded, the sigmoid rounded before its product); on the CPU it runs the kernels' PyTorch
specs, which are transformers' ops.

A prompt (or any call on a dynamic cache, or without one) on the GPU takes the same kernels around transformers' own
cache update and attention function (:func:`_prompt`): transformers' q and k norms and rotary embedding were ~20
elementwise launches a layer of a prompt, in a 512-token Qwen3-Next-style MoE prefill likely most of the 56 generic
elementwise kernels that took 0.76 ms of its 7.8 ms (``eval/results/moe_experts_h200/run4_verify/``). Anything else
(attention weights wanted, hooks on the norms, the CPU) runs transformers' forward.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from laquant.kernels.common.dispatch import use_triton
from laquant.models.cache import passed_cache
from laquant.models.quantizing_rowwise import NORM_WEIGHTS, formula_weight, mix_into, original_class

# attention classes whose forward is Qwen3-Next's: q_proj makes each head's query and output gate side by
# side ([..., H, 2 * D]), per-head q_norm and k_norm, partial rotary, o_proj(attention * sigmoid(gate))
GATED_ATTENTIONS = ("Qwen3NextAttention", "Qwen3_5Attention", "Qwen3_5MoeAttention")
_QKV = ("q_proj", "k_proj", "v_proj")


def _norm_ok(norm: nn.Module) -> bool:
    entry = NORM_WEIGHTS.get(original_class(norm).__name__)
    return entry is not None and not entry[2] and not (norm._forward_hooks or norm._forward_pre_hooks)


def _takes_step(attn: nn.Module, x: torch.Tensor, position_embeddings, cache, kwargs: dict) -> bool:
    from laquant.models.static_hybrid import ATTENTION, StaticHybridCache

    return (isinstance(cache, StaticHybridCache) and attn.layer_idx in cache.kv and x.dim() == 3 and x.shape[1] == 1
            and getattr(attn.config, "_attn_implementation", None) == ATTENTION and not attn.training
            and not kwargs.get("output_attentions") and position_embeddings is not None
            and position_embeddings[0].dim() == 3 and position_embeddings[0].shape[1] == 1
            and position_embeddings[0].dtype == x.dtype and _norm_ok(attn.q_norm) and _norm_ok(attn.k_norm))


def _static_step(attn: nn.Module, x: torch.Tensor, position_embeddings, attention_mask, cache) -> torch.Tensor:
    from laquant.kernels.attention import qk_norm_rope
    from laquant.models.static_hybrid import ALL_ATTENTION_FUNCTIONS, ATTENTION
    from laquant.quant.fused import glu_project, project

    B, D = x.shape[0], attn.head_dim
    fast = use_triton(x)
    qg, k, v = project(attn, _QKV, x)
    heads = qg.view(B, -1, 2 * D)  # [B, Hq, query | gate]
    kv_heads = k.shape[-1] // D
    k, v = k.view(B, kv_heads, D), v.view(B, kv_heads, -1)
    cos, sin = (t[:, 0] for t in position_embeddings)
    keys, values = cache.kv[attn.layer_idx]
    step = qk_norm_rope.qk_norm_rope_step_triton if fast else qk_norm_rope.qk_norm_rope_step
    query, gate = step(heads[..., :D], heads[..., D:], k, v, formula_weight(attn.q_norm), formula_weight(attn.k_norm),
                       attn.q_norm.eps, cos, sin, keys, values, cache.pos)
    out, _ = ALL_ATTENTION_FUNCTIONS[ATTENTION](attn, query, keys, values, attention_mask, scaling=attn.scaling)
    return glu_project(attn, "o_proj", gate.view(B, 1, -1), out.reshape(B, 1, -1), activation="sigmoid")


def _takes_prompt(attn: nn.Module, x: torch.Tensor, position_embeddings, cache, kwargs: dict) -> bool:
    from laquant.models.static_hybrid import StaticHybridCache

    return (use_triton(x) and not isinstance(cache, StaticHybridCache) and x.dim() == 3 and not attn.training
            and not kwargs.get("output_attentions") and position_embeddings is not None
            and position_embeddings[0].dim() == 3 and position_embeddings[0].dtype == x.dtype
            and _norm_ok(attn.q_norm) and _norm_ok(attn.k_norm))


def _prompt(attn: nn.Module, x: torch.Tensor, position_embeddings, attention_mask, cache, kwargs: dict):
    """transformers' forward of a gated attention (Qwen3-Next's) with the q / k norms and rotary embedding in one
    launch (:func:`~laquant.kernels.attention.qk_norm_rope.qk_norm_rope_triton`), q, k and v as one GEMM where they are
    quantized alike, and ``o_proj(o * sigmoid(gate))`` as :func:`~laquant.quant.fused.glu_project`; the cache update
    and the attention function are transformers' own."""
    import sys

    from laquant.kernels.attention.qk_norm_rope import qk_norm_rope_triton
    from laquant.models.cache import CACHE_KEYWORDS
    from laquant.models.static_hybrid import ALL_ATTENTION_FUNCTIONS
    from laquant.quant.fused import glu_project, project

    B, T = x.shape[:2]
    D = attn.head_dim
    qg, k, v = project(attn, _QKV, x)
    heads = qg.view(B, T, -1, 2 * D)  # [B, T, Hq, query | gate]
    kv_heads = k.shape[-1] // D
    cos, sin = position_embeddings
    query, key, gate = qk_norm_rope_triton(heads[..., :D], heads[..., D:], k.view(B, T, kv_heads, D),
                                           formula_weight(attn.q_norm), formula_weight(attn.k_norm), attn.q_norm.eps,
                                           cos, sin)
    value = v.view(B, T, kv_heads, -1).transpose(1, 2)
    if cache is not None:
        key, value = cache.update(key, value, attn.layer_idx)
    eager = sys.modules[original_class(attn).__module__].eager_attention_forward
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager)
    rest = {name: arg for name, arg in kwargs.items() if name not in CACHE_KEYWORDS}
    out, weights = interface(attn, query, key, value, attention_mask, dropout=0.0, scaling=attn.scaling, **rest)
    return glu_project(attn, "o_proj", gate, out.reshape(B, T, -1).contiguous(), activation="sigmoid"), weights


class _StaticStepAttention:
    """Mixed into a gated attention's class by :func:`install` (the original class next in the MRO)."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, *args, **kwargs):
        cache = passed_cache(kwargs)
        if not args and _takes_step(self, hidden_states, position_embeddings, cache, kwargs):
            return _static_step(self, hidden_states, position_embeddings, attention_mask, cache), None
        if not args and _takes_prompt(self, hidden_states, position_embeddings, cache, kwargs):
            return _prompt(self, hidden_states, position_embeddings, attention_mask, cache, kwargs)
        return super().forward(hidden_states, position_embeddings, attention_mask, *args, **kwargs)


def install(layers) -> int:
    """Give the attention layers of ``layers`` (a model's decoder layers) of a class in
    :data:`GATED_ATTENTIONS` the static-step forward; returns how many (:func:`mix_into`)."""
    return mix_into((getattr(layer, "self_attn", None) for layer in layers), _StaticStepAttention, GATED_ATTENTIONS)
