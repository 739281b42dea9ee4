"""Multi-head latent attention's decode step over the cached latents (MLA in the absorbed form: Kimi Linear's,
Ling / Ring's), flash-decoding style.

In the absorbed form (``laquant.models.mla_attention``) every query head attends over the same cached rows: a
latent ``c(t)`` (``R`` wide, ``kv_lora_rank``) that is both the key's main part and the value, and a shared rope part
``k_rope(t)`` (``P`` wide). Its scores are ``q_latent . c(t) + q_rope . k_rope(t)``; its output each head's weighted
latent ``sum_t p(t) c(t)``, which the caller projects through ``W_v``. As PyTorch ops (two batched GEMMs, a third
for the rope part, the scaling, the mask, the softmax and its cast) the latents are read twice and the scores make a
round trip through memory. :func:`latent_attention_triton` is one launch (two where the positions are split):

* a program takes one sequence, all its query heads (the rows of one tensor-core tile) and a span of positions; each
  step loads a block of latents once and uses it for the scores (transposed) and for the output; the scores in
  float32, scaled, the additive mask added, an online softmax in float32, the probabilities rounded to the latents'
  dtype for their product (as :mod:`.decode` does);
* a first pass over the mask bounds the loop at the last position some head sees (a static cache's unwritten room is
  not read); hidden positions before it get no weight; a row that sees nothing gets zeros;
* where the sequences would leave SMs idle the positions split into spans, combined by :mod:`.decode`'s second launch.

Spec: :func:`latent_attention` (float32, the probabilities unrounded).
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.sizes import next_power_of_2
from .decode import FLOATS, mask_args, split_buffers, split_positions

try:
    import triton
    import triton.language as tl

    from .decode import _combine_kernel, online_softmax_step, store_partials
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

# positions a loop step reads: 64 in 16-bit dtypes (R = 512: 64 KB of latents, two stages), 32 in float32 (the same
# bytes); swept on an H200 at Kimi Linear's shape (eval/results/kda_glue_h200/run5_latent_sweep/)
BLOCK_S = 64
MAX_HEADS = 128
MAX_WIDTH = 512  # the latent's and the rope part's widths, each


def latent_attention(q_latent: torch.Tensor, q_rope: torch.Tensor, latents: torch.Tensor, k_ropes: torch.Tensor,
                     mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """``softmax((q_latent c^T + q_rope k_rope^T) * scaling + mask) c`` in float32 for ``q_latent [B, H, R]``,
    ``q_rope [B, H, P]``, ``latents`` (c) ``[B, S, R]``, ``k_ropes [B, S, P]`` and an additive ``mask`` ``[B or 1, 1,
    1, S' >= S]`` (its first S positions read; the dtype's minimum or -inf hides a position; or None); returns each
    head's weighted latent ``[B, H, R]`` in q_latent's dtype. Rows that see nothing: zeros."""
    S = latents.shape[1]
    scores = (torch.bmm(q_latent.float(), latents.float().transpose(1, 2))
              + torch.bmm(q_rope.float(), k_ropes.float().transpose(1, 2))) * scaling
    if mask is not None:
        m = mask[:, 0, :, :S]
        scores = scores + m.float().masked_fill(m <= torch.finfo(mask.dtype).min, float("-inf"))
    dead = scores.amax(-1, keepdim=True) == float("-inf")
    probs = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    return torch.bmm(probs, latents.float()).to(q_latent.dtype)


if triton is not None:

    @triton.jit
    def _latent_attention_kernel(ql_ptr, qr_ptr, c_ptr, kr_ptr, mask_ptr, o_ptr, part_o_ptr, part_ml_ptr,
                                 s_qlb, s_qlh, s_qrb, s_qrh, s_cb, s_cs, s_krb, s_krs, s_mb, s_ob, s_oh,
                                 S, span, scaling, mask_min,
                                 H: tl.constexpr, R: tl.constexpr, P: tl.constexpr, BR: tl.constexpr,
                                 BDR: tl.constexpr, BP: tl.constexpr, BS: tl.constexpr, SPLITS: tl.constexpr,
                                 HAS_MASK: tl.constexpr, IEEE: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        sp = tl.program_id(1)
        rows = tl.arange(0, BR)
        mr = rows < H
        offs_r = tl.arange(0, BDR)
        offs_p = tl.arange(0, BP)
        mdr = offs_r < R
        mp = offs_p < P
        ql = tl.load(ql_ptr + b * s_qlb + rows[:, None] * s_qlh + offs_r[None, :], mask=mr[:, None] & mdr[None, :],
                     other=0.0)
        qr = tl.load(qr_ptr + b * s_qrb + rows[:, None] * s_qrh + offs_p[None, :], mask=mr[:, None] & mp[None, :],
                     other=0.0)
        c_rows = c_ptr + b * s_cb
        kr_rows = kr_ptr + b * s_krb
        m_i = tl.full([BR], float("-inf"), tl.float32)
        l_i = tl.zeros([BR], dtype=tl.float32)
        acc = tl.zeros([BR, BDR], dtype=tl.float32)
        lo = sp * span
        hi = tl.minimum(S, lo + span)
        if HAS_MASK:  # the span ends after the last position seen: the room not yet written is not read
            end = lo
            for s0 in range(lo, hi, BS):
                offs_s = s0 + tl.arange(0, BS)
                add = tl.load(mask_ptr + b * s_mb + offs_s, mask=offs_s < hi, other=float("-inf")).to(tl.float32)
                end = tl.maximum(end, tl.max(tl.where(add > mask_min, offs_s + 1, 0), axis=0))
            hi = end
        for s0 in range(lo, hi, BS):  # no branch inside: Triton pipelines the loads
            offs_s = s0 + tl.arange(0, BS)
            ms = offs_s < hi
            c = tl.load(c_rows + offs_s[:, None].to(tl.int64) * s_cs + offs_r[None, :], mask=ms[:, None] & mdr[None, :],
                        other=0.0)
            kr = tl.load(kr_rows + offs_s[:, None].to(tl.int64) * s_krs + offs_p[None, :],
                         mask=ms[:, None] & mp[None, :], other=0.0)
            if IEEE:
                scores = (tl.dot(ql, tl.trans(c), input_precision="ieee")
                          + tl.dot(qr, tl.trans(kr), input_precision="ieee"))
            else:
                scores = tl.dot(ql, tl.trans(c)) + tl.dot(qr, tl.trans(kr))
            if HAS_MASK:  # a hidden position (the mask's minimum or -inf) gets no weight, whatever its score
                add = tl.load(mask_ptr + b * s_mb + offs_s, mask=ms, other=float("-inf")).to(tl.float32)
                scores = tl.where((add > mask_min)[None, :], scores * scaling + add[None, :], float("-inf"))
            else:
                scores = tl.where(ms[None, :], scores * scaling, float("-inf"))
            m_i, l_i, acc = online_softmax_step(scores, c, m_i, l_i, acc, IEEE)
        if SPLITS == 1:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that sees nothing: zeros
            tl.store(o_ptr + b * s_ob + rows[:, None] * s_oh + offs_r[None, :], out.to(o_ptr.dtype.element_ty),
                     mask=mr[:, None] & mdr[None, :])
        else:  # decode's _combine_kernel sums the spans (one key head, one token)
            store_partials(part_o_ptr, part_ml_ptr, (b * SPLITS + sp).to(tl.int64), rows, offs_r, acc, m_i, l_i,
                           BR, BDR)


def fits(q_latent: torch.Tensor, q_rope: torch.Tensor, latents: torch.Tensor, k_ropes: torch.Tensor,
         mask: torch.Tensor | None) -> bool:
    """Whether :func:`latent_attention_triton` takes these inputs (else the caller runs its own ops)."""
    if q_latent.dim() != 3 or q_rope.dim() != 3 or latents.dim() != 3 or k_ropes.dim() != 3:
        return False
    B, H, R = q_latent.shape
    S, P = latents.shape[1], k_ropes.shape[-1]
    if min(B, H, R, S, P) == 0 or H > MAX_HEADS or max(R, P) > MAX_WIDTH:
        return False
    if q_rope.shape != (B, H, P) or latents.shape != (B, S, R) or k_ropes.shape != (B, S, P):
        return False
    tensors = (q_latent, q_rope, latents, k_ropes)
    if q_latent.dtype not in FLOATS or any(t.dtype != q_latent.dtype or t.device != q_latent.device for t in tensors):
        return False
    if any(t.stride(-1) != 1 for t in tensors):
        return False
    if mask is not None:
        if (mask.dim() != 4 or mask.dtype not in FLOATS or mask.device != q_latent.device or mask.shape[1] != 1
                or mask.shape[0] not in (1, B) or mask.shape[2] != 1 or mask.shape[3] < S or mask.stride(-1) != 1):
            return False
    return True


def latent_attention_triton(q_latent: torch.Tensor, q_rope: torch.Tensor, latents: torch.Tensor,
                            k_ropes: torch.Tensor, mask: torch.Tensor | None, scaling: float,
                            splits: int | None = None) -> torch.Tensor:
    """The Triton twin of :func:`latent_attention` (see the module docstring); ``splits``: spans of positions (default:
    :mod:`.decode`'s rule, the programs being the sequences)."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use latent_attention")
    if not fits(q_latent, q_rope, latents, k_ropes, mask):
        raise ValueError(f"latent attention takes q_latent [B, H, R], q_rope [B, H, P], latents [B, S, R], k_ropes "
                         f"[B, S, P] of one float dtype (last dimension contiguous, H <= {MAX_HEADS}, R, P <= "
                         f"{MAX_WIDTH}) and a float mask [B or 1, 1, 1, >= S]; got {tuple(q_latent.shape)}, "
                         f"{tuple(q_rope.shape)}, {tuple(latents.shape)}, {tuple(k_ropes.shape)}, mask "
                         f"{None if mask is None else tuple(mask.shape)}")
    B, H, R = q_latent.shape
    S, P = latents.shape[1], k_ropes.shape[-1]
    block = BLOCK_S if latents.element_size() <= 2 else BLOCK_S // 2
    splits, span = split_positions(S, B, block, splits, q_latent.device)
    BR = max(16, next_power_of_2(H))
    BDR, BP = max(16, next_power_of_2(R)), max(16, next_power_of_2(P))
    out = torch.empty(B, H, R, dtype=q_latent.dtype, device=q_latent.device)
    part_o, part_ml = split_buffers(B, splits, BR, BDR, out)
    m, s_mb, _, mask_min = mask_args(mask, q_latent)  # one token: no token stride
    step_bytes = block * (BDR + BP) * latents.element_size()
    launch_kernel(_latent_attention_kernel, (B, splits),
        q_latent, q_rope, latents, k_ropes, m, out, part_o, part_ml, q_latent.stride(0), q_latent.stride(1),
        q_rope.stride(0), q_rope.stride(1), latents.stride(0), latents.stride(1), k_ropes.stride(0), k_ropes.stride(1),
        s_mb, out.stride(0), out.stride(1), S, span, float(scaling), mask_min, H=H, R=R, P=P, BR=BR, BDR=BDR, BP=BP,
        BS=block, SPLITS=splits, HAS_MASK=mask is not None, IEEE=q_latent.dtype == torch.float32,
        num_warps=4 if BR * BDR <= 64 * 128 else 8, num_stages=3 if step_bytes <= 48 * 1024 else 2)
    if splits > 1:  # decode's combine: one key head of H query heads, one token
        launch_kernel(_combine_kernel, (B,),
            part_o, part_ml, out, out.stride(0), 0, out.stride(1), 1, T=1, G=H, DV=R, BR=BR,
            BDV=BDR, SPLITS=splits, BSP=next_power_of_2(splits), num_warps=4)
    return out
