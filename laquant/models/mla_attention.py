"""Multi-head latent attention (MLA: Kimi Linear's, Ling / Ring's) decoding in the absorbed form.

transformers' forward caches each token's latent ``c`` (``kv_lora_rank`` wide, after ``kv_a_layernorm``)
and its shared rope part, and at every call expands all cached latents through ``kv_b_proj`` into
per-head keys and values: a decode step re-projects the whole context, O(context) GEMM work a layer (at
B = 64 after a 1K prompt, most of the 1.37B Kimi model's step: ``eval/results/families_h200/``). The
rotary embedding (Ling's; Kimi's MLA has none) touches only the shared rope part, so with ``W_k[h]`` and
``W_v[h]`` the key and value rows of ``kv_b_proj`` for head h (DeepSeek-V2's "absorbed" decode):

    q_h . k_h(t) = (W_k[h]^T q_nope_h) . c(t) + q_rope_h . k_rope(t)
    sum_t p_h(t) v_h(t) = W_v[h] (sum_t p_h(t) c(t))

so the step attends over the cached latents themselves, one key "head" shared by all query heads, and
projects each head's weighted latent once (then Ling's head-wise output gate). On the GPU that attention is one
kernel (:mod:`laquant.kernels.attention.latent`: each block of latents read once, the scores in float32, the
unwritten room of a static cache not read); elsewhere, with a boolean mask or under autograd, PyTorch's ops.
:func:`install`'s forward runs it on every one-token step on a cache: the static cache of the graphed loops,
and transformers' own cache (eager decoding, ``eval ppl --mode decode``), so that both decode alike. PyTorch's
ops take the scores as transformers' eager attention does (in the input dtype, the mask added, softmax in float32),
the kernel in float32; either equals transformers' up to rounding. A quantized ``kv_b_proj`` enters with its
dequantized weight (the int8 codes times their scales, the outlier columns as stored): the latents are not
quantized as its W8A8 call would, the one numerics difference of these steps. Prompts (several tokens), attention
weights wanted, hooks on ``kv_b_proj`` (calibration's observers) or another attention implementation run
transformers' forward.
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn

from laquant.kernels.attention import latent as latent_kernels
from laquant.kernels.common.dispatch import use_triton
from laquant.models.cache import passed_cache
from laquant.models.quantizing_rowwise import mix_into, original_class

# MLA classes: the function of their modeling module that rotates the rope part (None: no rotary), and the
# projection of their head-wise sigmoid output gate (None: none)
MLA_ATTENTIONS = {
    "KimiLinearAttention": (None, None),
    "BailingHybridAttention": ("apply_rotary_pos_emb_interleave", "g_proj"),
}


def _rotary(attn: nn.Module):
    name = MLA_ATTENTIONS[original_class(attn).__name__][0]
    return getattr(sys.modules[original_class(attn).__module__], name) if name else None


def _takes_step(attn: nn.Module, x: torch.Tensor, cache, kwargs: dict) -> bool:
    """A one-token step on a cache: the static cache of the graphed loops (its attention registered), or
    transformers' own cache under its eager or SDPA attention with no mask or a 4-D one."""
    from laquant.models.static_hybrid import ATTENTION, StaticHybridCache

    if (cache is None or x.dim() != 3 or x.shape[1] != 1 or attn.training or kwargs.get("output_attentions")
            or attn.kv_b_proj._forward_hooks or attn.kv_b_proj._forward_pre_hooks):
        return False
    implementation = getattr(attn.config, "_attn_implementation", None)
    if isinstance(cache, StaticHybridCache):
        if attn.layer_idx not in cache.kv or implementation != ATTENTION:
            return False
    elif implementation not in ("eager", "sdpa"):
        return False
    mask = kwargs.get("attention_mask")
    if mask is not None and (mask.dim() != 4 or mask.shape[-2] != 1):
        return False
    rope = kwargs.get("position_embeddings")
    return _rotary(attn) is None or (rope is not None and rope[0].dim() == 3 and rope[0].shape[1] == 1)


def _weight_key(module: nn.Module) -> tuple:
    return tuple((t.data_ptr(), t._version) for t in (*module.parameters(), *module.buffers()))


def absorbed_weights(attn: nn.Module, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_k [H, qk_nope_head_dim, R], W_v [H, R, v_head_dim])`` out of ``kv_b_proj`` in ``dtype``, kept
    on the module until its weights change (computed at the warm-up before a capture)."""
    proj = attn.kv_b_proj
    key = (_weight_key(proj), dtype)
    kept = getattr(attn, "_laquant_absorbed", None)
    if kept is None or kept[0] != key:
        w = proj.dequantized_weight() if hasattr(proj, "dequantized_weight") else proj.weight
        w = w.to(dtype).view(attn.num_heads, attn.qk_nope_head_dim + attn.v_head_dim, attn.kv_lora_rank)
        nope = attn.qk_nope_head_dim
        kept = (key, w[:, :nope].contiguous(), w[:, nope:].transpose(1, 2).contiguous())
        attn._laquant_absorbed = kept
    return kept[1], kept[2]


def _absorbed_step(attn: nn.Module, x: torch.Tensor, attention_mask, cache,
                   position_embeddings=None) -> torch.Tensor:
    B = x.shape[0]
    H, nope, R = attn.num_heads, attn.qk_nope_head_dim, attn.kv_lora_rank
    if attn.q_lora_rank is None:
        q = attn.q_proj(x)
    else:
        q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x)))
    q = q.view(B, 1, H, attn.qk_head_dim).transpose(1, 2)  # [B, H, 1, D], as transformers' forward
    latent, k_rope = torch.split(attn.kv_a_proj_with_mqa(x), [R, attn.qk_rope_head_dim], dim=-1)
    latent = attn.kv_a_layernorm(latent)
    q_rope, k_rope = q[..., nope:], k_rope.reshape(B, 1, 1, -1)
    rotate = _rotary(attn)
    if rotate is not None:
        q_rope, k_rope = rotate(q_rope, k_rope, *position_embeddings)
    latents, k_ropes = cache.update(latent.view(B, 1, 1, R), k_rope, attn.layer_idx)
    latents, k_ropes = latents[:, 0], k_ropes[:, 0]  # [B, S, R], [B, S, rope]
    w_k, w_v = absorbed_weights(attn, x.dtype)
    q_latent = torch.bmm(q[:, :, 0, :nope].transpose(0, 1), w_k).transpose(0, 1)  # [B, H, R]
    q_rope = q_rope[:, :, 0]
    if use_triton(q_latent) and latent_kernels.fits(q_latent, q_rope, latents, k_ropes, attention_mask):
        context = latent_kernels.latent_attention_triton(q_latent, q_rope, latents, k_ropes, attention_mask,
                                                         attn.scaling)
    else:
        scores = torch.baddbmm(torch.bmm(q_latent, latents.transpose(1, 2)), q_rope, k_ropes.transpose(1, 2))
        scores = scores * attn.scaling
        if attention_mask is not None:  # [B, 1, 1, S']: additive, or where to attend
            mask = attention_mask[:, 0, :, :scores.shape[-1]]
            scores = (scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool
                      else scores + mask)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(x.dtype)
        context = torch.bmm(probs, latents)  # [B, H, R]: each head's weighted latent
    out = torch.bmm(context.transpose(0, 1), w_v).transpose(0, 1)  # [B, H, v_head_dim]
    gate = MLA_ATTENTIONS[original_class(attn).__name__][1]
    if gate is not None:  # the head-wise output gate, rounded as transformers rounds it
        out = out * torch.sigmoid(getattr(attn, gate)(x).float()).to(x.dtype).view(B, H, 1)
    return attn.o_proj(out.reshape(B, 1, H * attn.v_head_dim))


class _AbsorbedStepAttention:
    """Mixed into an MLA attention's class by :func:`install` (the original class next in the MRO)."""

    def forward(self, hidden_states, *args, **kwargs):
        cache = passed_cache(kwargs)
        if not args and _takes_step(self, hidden_states, cache, kwargs):
            return _absorbed_step(self, hidden_states, kwargs.get("attention_mask"), cache,
                                kwargs.get("position_embeddings")), None
        return super().forward(hidden_states, *args, **kwargs)


def install(layers) -> int:
    """Give the attention layers of ``layers`` (a model's decoder layers) of a class in
    :data:`MLA_ATTENTIONS` the absorbed decode step; returns how many (:func:`mix_into`)."""
    return mix_into((getattr(layer, "self_attn", None) for layer in layers), _AbsorbedStepAttention, MLA_ATTENTIONS)
