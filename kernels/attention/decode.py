"""Softmax attention of a few query tokens over a static key / value cache (the graphed decode steps of the
transformers hybrids), flash-decoding style.

transformers' eager attention over a static cache (``laquant.models.static_hybrid``) is six launches a layer
(the scores' GEMM, the scaling, the mask, the softmax, its cast, the values' GEMM), and reads every position
of the cache's capacity, written or not: a graphed step pays for the room it was captured with (1,024 more
tokens in ``model.generate``). :func:`decode_attention_triton` is one launch (two where the positions are split):

* a program takes one sequence, one key head with its group of query heads and their ``T`` tokens (the rows of
  one tensor-core tile), and a span of positions; the scores ``q k^T`` in float32, scaled, the additive mask
  added, an online softmax in float32, the probabilities rounded to the values' dtype for their product with
  ``v`` (as the flash kernels behind PyTorch's SDPA do);
* a position whose mask is ``finfo(dtype).min`` (or ``-inf``) is hidden (no weight; in transformers' softmax its
  weight underflows to zero the same way); a first pass over the mask finds the last position some row sees, and
  the positions after it (a static cache's unwritten room) are not read. Hidden positions before it are read
  with weight zero (their keys and values must be finite, as a static cache's zeros and written tokens are);
* where the programs would leave SMs idle (few sequences or key heads), the positions split into spans whose
  partial results (running maximum, sum and output) a second launch combines.

Spec: :func:`decode_attention`, the same formula in float32 (the probabilities unrounded). A row whose every
position is masked gets zeros (transformers' eager softmax would average the values); a decode step's row always
sees its own token.
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.sizes import cdiv, next_power_of_2, sm_count

try:
    import triton
    import triton.language as tl
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

BLOCK_S = 64  # positions a program's loop step reads
MIN_SPAN = 128  # positions every split but the last covers at least
MAX_ROWS = 128  # query heads of a group times tokens: one program's rows
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
STAGED_BYTES = 64 * 1024  # a loop step's keys and values up to this size are pipelined three deep, larger ones not


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scaling: float) -> torch.Tensor:
    """``softmax(q k^T * scaling + mask) v`` in float32 for ``q [B, Hq, T, D]``, ``k [B, Hkv, S, D]``,
    ``v [B, Hkv, S, Dv]`` (the query heads grouped by key head, ``Hq / Hkv`` each) and an additive ``mask``
    ``[B or 1, 1, T or 1, S' >= S]`` (its first S positions read; or None); returns ``[B, T, Hq, Dv]`` in q's
    dtype. Fully masked rows: zeros."""
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[-2]
    G = Hq // Hkv
    scores = torch.matmul(q.float().reshape(B, Hkv, G * T, D), k.float().transpose(-1, -2)) * scaling
    if mask is not None:  # a position whose mask is the dtype's minimum (or -inf) is hidden
        add = mask[..., :S].float().masked_fill(mask[..., :S] <= torch.finfo(mask.dtype).min, float("-inf"))
        scores = (scores.view(B, Hkv, G, T, S) + add[:, :, None]).view(B, Hkv, G * T, S)
    dead = scores.amax(-1, keepdim=True) == float("-inf")
    probs = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    out = torch.matmul(probs, v.float()).view(B, Hq, T, v.shape[-1])
    return out.transpose(1, 2).to(q.dtype).contiguous()


if triton is not None:

    @triton.jit
    def online_softmax_step(scores, v, m_i, l_i, acc, IEEE: tl.constexpr):
        """One block of positions into a running softmax: ``scores`` ``[rows, block]`` (float32, -inf where hidden) and
        the block's values ``v`` ``[block, width]`` update the running max ``m_i``, sum ``l_i`` and weighted values
        ``acc`` (float32), returned in that order."""
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def store_partials(part_o_ptr, part_ml_ptr, part, rows, cols, acc, m_i, l_i, BR: tl.constexpr, BD: tl.constexpr):
        """A span's unnormalized output ``acc`` and its running max / sum, in the layout :func:`_combine_kernel` reads:
        ``part`` the (program, span) index, ``rows`` the tile's rows, ``cols`` the output's columns."""
        tl.store(part_o_ptr + (part * BR + rows[:, None]) * BD + cols[None, :], acc)
        tl.store(part_ml_ptr + (part * 2) * BR + rows, m_i)
        tl.store(part_ml_ptr + (part * 2 + 1) * BR + rows, l_i)

    @triton.jit
    def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, part_o_ptr, part_ml_ptr,
                                 s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_mb, s_mt, s_ob, s_ot, s_oh,
                                 Hkv, S, span, scaling, mask_min,
                                 T: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                                 BR: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, BS: tl.constexpr,
                                 SPLITS: tl.constexpr, HAS_MASK: tl.constexpr, IEEE: tl.constexpr):
        bh = tl.program_id(0)
        sp = tl.program_id(1)
        b = (bh // Hkv).to(tl.int64)
        h = (bh % Hkv).to(tl.int64)
        rows = tl.arange(0, BR)  # row r: query head h * G + r // T, token r % T
        head = h * G + rows // T
        t = rows % T
        mr = rows < G * T
        offs_d = tl.arange(0, BD)
        offs_dv = tl.arange(0, BDV)
        md = offs_d < D
        mdv = offs_dv < DV
        q = tl.load(q_ptr + b * s_qb + head[:, None] * s_qh + t[:, None] * s_qt + offs_d[None, :],
                    mask=mr[:, None] & md[None, :], other=0.0)
        k_rows = k_ptr + b * s_kb + h * s_kh
        v_rows = v_ptr + b * s_vb + h * s_vh
        m_i = tl.full([BR], float("-inf"), tl.float32)
        l_i = tl.zeros([BR], dtype=tl.float32)
        acc = tl.zeros([BR, BDV], dtype=tl.float32)
        lo = sp * span
        hi = tl.minimum(S, lo + span)
        if HAS_MASK:  # the span ends after the last position some row sees: the room not yet written is not read
            end = lo
            for s0 in range(lo, hi, BS):
                offs_s = s0 + tl.arange(0, BS)
                add = tl.load(mask_ptr + b * s_mb + t[:, None] * s_mt + offs_s[None, :],
                              mask=mr[:, None] & (offs_s < hi)[None, :], other=float("-inf")).to(tl.float32)
                seen = tl.max(tl.where(add > mask_min, offs_s[None, :] + 1, 0), axis=1)
                end = tl.maximum(end, tl.max(seen, axis=0))
            hi = end
        for s0 in range(lo, hi, BS):  # no branch inside: Triton pipelines the loads
            offs_s = s0 + tl.arange(0, BS)
            ms = offs_s < hi
            kt = tl.load(k_rows + offs_s[None, :].to(tl.int64) * s_ks + offs_d[:, None],
                         mask=md[:, None] & ms[None, :], other=0.0)
            if IEEE:
                scores = tl.dot(q, kt, input_precision="ieee")
            else:
                scores = tl.dot(q, kt)
            if HAS_MASK:  # a hidden position (the mask's minimum or -inf) gets no weight, whatever its score
                add = tl.load(mask_ptr + b * s_mb + t[:, None] * s_mt + offs_s[None, :], mask=mr[:, None] & ms[None, :],
                              other=float("-inf")).to(tl.float32)
                scores = tl.where(add > mask_min, scores * scaling + add, float("-inf"))
            else:
                scores = tl.where(ms[None, :], scores * scaling, float("-inf"))
            vv = tl.load(v_rows + offs_s[:, None].to(tl.int64) * s_vs + offs_dv[None, :],
                         mask=ms[:, None] & mdv[None, :], other=0.0)
            m_i, l_i, acc = online_softmax_step(scores, vv, m_i, l_i, acc, IEEE)
        if SPLITS == 1:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that sees nothing: zeros
            tl.store(o_ptr + b * s_ob + t[:, None] * s_ot + head[:, None] * s_oh + offs_dv[None, :],
                     out.to(o_ptr.dtype.element_ty), mask=mr[:, None] & mdv[None, :])
        else:
            store_partials(part_o_ptr, part_ml_ptr, (bh * SPLITS + sp).to(tl.int64), rows, offs_dv, acc, m_i, l_i,
                           BR, BDV)

    @triton.jit
    def _combine_kernel(part_o_ptr, part_ml_ptr, o_ptr, s_ob, s_ot, s_oh, Hkv,
                        T: tl.constexpr, G: tl.constexpr, DV: tl.constexpr, BR: tl.constexpr, BDV: tl.constexpr,
                        SPLITS: tl.constexpr, BSP: tl.constexpr):
        bh = tl.program_id(0)
        b = (bh // Hkv).to(tl.int64)
        h = (bh % Hkv).to(tl.int64)
        rows = tl.arange(0, BR)
        head = h * G + rows // T
        t = rows % T
        offs_dv = tl.arange(0, BDV)
        splits = tl.arange(0, BSP)
        parts = (bh * SPLITS + splits).to(tl.int64)
        live = splits < SPLITS
        m = tl.load(part_ml_ptr + (parts[:, None] * 2) * BR + rows[None, :], mask=live[:, None], other=float("-inf"))
        l_part = tl.load(part_ml_ptr + (parts[:, None] * 2 + 1) * BR + rows[None, :], mask=live[:, None], other=0.0)
        m_max = tl.max(m, axis=0)
        w = tl.exp(m - tl.where(m_max == float("-inf"), 0.0, m_max)[None, :])  # [BSP, BR]
        l_i = tl.sum(w * l_part, axis=0)
        acc = tl.zeros([BR, BDV], dtype=tl.float32)
        for s in range(0, SPLITS):
            ws = tl.sum(tl.where(splits[:, None] == s, w, 0.0), axis=0)
            part = (bh * SPLITS + s).to(tl.int64)
            acc += ws[:, None] * tl.load(part_o_ptr + (part * BR + rows[:, None]) * BDV + offs_dv[None, :])
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that sees nothing: zeros
        tl.store(o_ptr + b * s_ob + t[:, None] * s_ot + head[:, None] * s_oh + offs_dv[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=(rows < G * T)[:, None] & (offs_dv < DV)[None, :])


def split_positions(S: int, programs: int, block: int, splits: int | None, device: torch.device) -> tuple[int, int]:
    """``(splits, span)``: the spans S positions split into for ``programs`` programs, each span a multiple of
    ``block`` positions, none empty. ``splits`` None: one span from half an SM's worth of programs on, below about two
    programs an SM, every span but the last at least :data:`MIN_SPAN` positions (swept on an H200,
    eval/results/hybrid_decode_h200/run5_splits/)."""
    if splits is None:
        sms = sm_count(device)
        splits = 1 if 2 * programs >= sms else min(cdiv(2 * sms, programs), cdiv(S, MIN_SPAN))
    span = cdiv(cdiv(S, max(1, splits)), block) * block
    return max(1, cdiv(S, span)), span


def split_buffers(programs: int, splits: int, BR: int, BDV: int, out: torch.Tensor):
    """``(part_o, part_ml)``: each span's output rows and running maximum and sum, which :func:`_combine_kernel`
    reads; ``out`` stands in for both where there is one span (the kernel then writes the output itself)."""
    if splits == 1:
        return out, out
    return (torch.empty(programs * splits, BR, BDV, dtype=torch.float32, device=out.device),
            torch.empty(programs * splits, 2, BR, dtype=torch.float32, device=out.device))


def mask_args(mask: torch.Tensor | None, stand_in: torch.Tensor):
    """``(pointer, batch stride, token stride, hidden value)`` of an additive mask ``[B or 1, 1, T or 1, S']`` (its
    broadcast dimensions stride 0); ``stand_in`` is passed where there is no mask."""
    if mask is None:
        return stand_in, 0, 0, 0.0
    return (mask, mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(2) if mask.shape[2] > 1 else 0,
            torch.finfo(mask.dtype).min)


def fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether :func:`decode_attention_triton` takes these inputs (else the caller runs its own attention)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    B, Hq, T, D = q.shape
    Hkv, S, DV = k.shape[1], k.shape[-2], v.shape[-1]
    if min(B, Hq, T, D, Hkv, S, DV) == 0 or Hq % Hkv or (Hq // Hkv) * T > MAX_ROWS or max(D, DV) > 256:
        return False
    if k.shape[:2] != (B, Hkv) or k.shape[-1] != D or v.shape[:3] != k.shape[:3]:
        return False
    if q.dtype not in FLOATS or not q.dtype == k.dtype == v.dtype or not q.device == k.device == v.device:
        return False
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        return False
    if mask is not None:
        if mask.dim() != 4 or mask.dtype not in FLOATS or mask.device != q.device or mask.shape[1] != 1 \
                or mask.shape[0] not in (1, B) or mask.shape[2] not in (1, T) or mask.shape[3] < S \
                or mask.stride(-1) != 1:
            return False
    return True


def decode_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                            scaling: float, splits: int | None = None) -> torch.Tensor:
    """The Triton twin of :func:`decode_attention` (see the module docstring); ``splits``: spans of positions
    (default: one where the sequences' key heads fill half the SMs, else about two programs an SM, every span but
    the last at least :data:`MIN_SPAN` positions). Each launch's shape and split count compile a variant of their
    own: a CUDA graph captures it after a warm-up run (``laquant.generate.warm_up_outside_capture``)."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use decode_attention")
    if not fits(q, k, v, mask):
        raise ValueError(f"decode attention takes q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv] (last dimension "
                         f"contiguous, Hq a multiple of Hkv, Hq / Hkv * T <= {MAX_ROWS}, D, Dv <= 256) and a float "
                         f"mask [B or 1, 1, T or 1, >= S]; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, mask {None if mask is None else tuple(mask.shape)}")
    B, Hq, T, D = q.shape
    Hkv, S, DV = k.shape[1], k.shape[-2], v.shape[-1]
    G = Hq // Hkv
    programs = B * Hkv
    splits, span = split_positions(S, programs, BLOCK_S, splits, q.device)
    BR = max(16, next_power_of_2(G * T))
    BD, BDV = max(16, next_power_of_2(D)), max(16, next_power_of_2(DV))
    out = torch.empty(B, T, Hq, DV, dtype=q.dtype, device=q.device)
    part_o, part_ml = split_buffers(programs, splits, BR, BDV, out)
    m, s_mb, s_mt, mask_min = mask_args(mask, q)
    warps = 4 if BR * max(BD, BDV) <= 64 * 128 else 8
    step_bytes = BLOCK_S * (BD + BDV) * k.element_size()  # float32 at D = 256 would not fit three in shared memory
    stages = 3 if step_bytes <= STAGED_BYTES else 1
    launch_kernel(_decode_attention_kernel, (programs, splits),
        q, k, v, m, out, part_o, part_ml, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), s_mb, s_mt, out.stride(0), out.stride(1), out.stride(2), Hkv, S, span,
        float(scaling), mask_min, T=T, G=G, D=D, DV=DV, BR=BR, BD=BD, BDV=BDV, BS=BLOCK_S, SPLITS=splits,
        HAS_MASK=mask is not None, IEEE=q.dtype == torch.float32, num_warps=warps, num_stages=stages)
    if splits > 1:
        launch_kernel(_combine_kernel, (programs,),
            part_o, part_ml, out, out.stride(0), out.stride(1), out.stride(2), Hkv, T=T, G=G,
            DV=DV, BR=BR, BDV=BDV, SPLITS=splits, BSP=next_power_of_2(splits),
            num_warps=4)
    return out
