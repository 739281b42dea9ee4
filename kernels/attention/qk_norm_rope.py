"""A decode token's query and key heads made ready for a gated softmax attention (Qwen3-Next, Qwen3.5),
in one launch: per-head RMSNorm, partial rotary embedding, and the key and value written into a
static cache at a device-side position. A prompt's (:func:`qk_norm_rope_triton`) the same for every token, the
query and key heads written in attention's ``[B, H, T, D]`` layout (the cache update is then transformers').

In transformers this is about 35 launches a layer: the q and k norms (float32 upcast, square, mean,
rsqrt, two products, downcast: ~10 each), the rotary embedding's slices, products, negation and two
cats for each of q and k, the copy of the output gate out of ``q_proj``'s interleaved layout, and the
two ``index_copy_`` of the cache update. :func:`qk_norm_rope_step_triton` reads q, the gate, k and v
where the projections wrote them (strided views of one output) and writes the query heads, the gate
(contiguous, for the gated output's kernel) and the cache.

Spec: :func:`qk_norm_rope_step` (:func:`qk_norm_rope_reference` for a prompt), which is transformers' formulas op for
op (``Qwen3NextRMSNorm``:
the normalized rows times the float32 weight, one rounding; ``apply_rotary_pos_emb``: each product
and the sum rounded to the model's dtype). The kernel rounds where they do; only the order of the
mean's sum differs, so the two agree to the rounding of the dtype, not bit for bit.
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.pdl import pdl_launch
from ..common.sizes import next_power_of_2
from ..rowwise.reference import rms_norm

try:
    import triton
    import triton.language as tl

    from ..common.pdl import pdl_prologue
    from ..common.triton_numerics import rounded
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def _check(q, gate, k, v, q_weight, k_weight, cos, sin, keys, values, pos):
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or keys.dim() != 4:
        raise ValueError(f"expected q [B, Hq, D], k and v [B, Hkv, D], keys [B, Hkv, S, D]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(keys.shape)}")
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    if (gate is not None and gate.shape != q.shape) or k.shape != (B, Hkv, D) or v.shape[:2] != (B, Hkv):
        raise ValueError(f"gate {None if gate is None else tuple(gate.shape)}, k {tuple(k.shape)} and "
                         f"v {tuple(v.shape)} do not fit q {tuple(q.shape)}")
    if keys.shape[:2] != (B, Hkv) or keys.shape[-1] != D or values.shape[:3] != keys.shape[:3] \
            or values.shape[-1] != v.shape[-1]:
        raise ValueError(f"cache keys {tuple(keys.shape)} / values {tuple(values.shape)} do not fit k {tuple(k.shape)}"
                         f" and v {tuple(v.shape)}")
    _check_heads(q, Hq, Hkv, D, q_weight, k_weight, cos, sin, (B,), "[B or 1, R]")
    if pos.numel() != 1 or pos.dtype != torch.long:
        raise ValueError("pos must be one int64 position")


def _check_heads(q, Hq, Hkv, D, q_weight, k_weight, cos, sin, rows: tuple, layout: str):
    """What a decode token's and a prompt's checks share: the norm weights, cos and sin (``[B or 1, *rows[1:], R]``:
    ``layout`` names it) and the heads' grouping."""
    if q_weight.shape != (D,) or k_weight.shape != (D,):
        raise ValueError(f"the norm weights must be [{D}]; got {tuple(q_weight.shape)}, {tuple(k_weight.shape)}")
    R = cos.shape[-1]
    if (cos.shape != sin.shape or cos.dim() != len(rows) + 1 or cos.shape[0] not in (1, rows[0])
            or tuple(cos.shape[1:-1]) != rows[1:] or R > D or R % 2):
        raise ValueError(f"cos and sin must be {layout} with an even R <= {D}; got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)}")
    if cos.dtype != q.dtype or sin.dtype != q.dtype:
        raise TypeError(f"cos and sin must be in q's dtype {q.dtype} (transformers casts them to it); got {cos.dtype}")
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads do not group over {Hkv} key heads")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``apply_rotary_pos_emb`` on one tensor ``x [B, H, D]``, cos and sin ``[B or 1, R]``."""
    cos, sin = cos[:, None], sin[:, None]
    R = cos.shape[-1]
    rot, rest = x[..., :R], x[..., R:]
    half = torch.cat((-rot[..., R // 2:], rot[..., :R // 2]), dim=-1)
    return torch.cat(((rot * cos) + (half * sin), rest), dim=-1)


def qk_norm_rope_step(q: torch.Tensor, gate: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor,
                      q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, cos: torch.Tensor,
                      sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor):
    """One decode token: ``q [B, Hq, D]``, its output ``gate [B, Hq, D]`` (or None), ``k, v [B, Hkv, D]``.
    Normalizes each head of q and k (``rmsnorm(x) * weight``, the float32 ``weight [D]`` of the norm's
    formula, e.g. ``1 + w`` for Qwen3-Next's), rotates their first ``R`` channels by ``cos``, ``sin``
    ``[B or 1, R]``, and writes k and v at position ``pos`` (int64 ``[1]``) of ``keys [B, Hkv, S, D]``
    and ``values``. Returns ``(query [B, Hq, 1, D], gate [B, Hq * D] contiguous or None)``."""
    _check(q, gate, k, v, q_weight, k_weight, cos, sin, keys, values, pos)
    query = _rotate(rms_norm(q, q_weight, eps)[0], cos, sin)
    key = _rotate(rms_norm(k, k_weight, eps)[0], cos, sin)
    keys.index_copy_(2, pos, key[:, :, None].to(keys.dtype))
    values.index_copy_(2, pos, v[:, :, None].to(values.dtype))
    return query[:, :, None].contiguous(), None if gate is None else gate.reshape(gate.shape[0], -1).contiguous()


def _check_prompt(q, gate, k, q_weight, k_weight, cos, sin):
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"expected q [B, T, Hq, D] and k [B, T, Hkv, D]; got {tuple(q.shape)}, {tuple(k.shape)}")
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    if (gate is not None and gate.shape != q.shape) or k.shape != (B, T, Hkv, D):
        raise ValueError(f"gate {None if gate is None else tuple(gate.shape)} and k {tuple(k.shape)} do not fit "
                         f"q {tuple(q.shape)}")
    _check_heads(q, Hq, Hkv, D, q_weight, k_weight, cos, sin, (B, T), f"[B or 1, {T}, R]")


def qk_norm_rope_reference(q: torch.Tensor, gate: torch.Tensor | None, k: torch.Tensor, q_weight: torch.Tensor,
                           k_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor):
    """A prompt: ``q [B, T, Hq, D]``, its output ``gate`` (or None), ``k [B, T, Hkv, D]``, ``cos`` and ``sin``
    ``[B or 1, T, R]``. Each head of q and k normalized and rotated as :func:`qk_norm_rope_step` does it. Returns
    ``(query [B, Hq, T, D], key [B, Hkv, T, D], gate [B, T, Hq * D] or None)``, each contiguous."""
    _check_prompt(q, gate, k, q_weight, k_weight, cos, sin)
    query = _rotate(rms_norm(q, q_weight, eps)[0].transpose(1, 2), cos, sin)
    key = _rotate(rms_norm(k, k_weight, eps)[0].transpose(1, 2), cos, sin)
    out_gate = None if gate is None else gate.reshape(*gate.shape[:2], -1).contiguous()
    return query.contiguous(), key.contiguous(), out_gate


if triton is not None:

    @triton.jit
    def _normed_rotated(row, w_ptr, cos_row, sin_row, d, D, R, eps):
        """A head's row at ``row`` normalized, times the weight at ``w_ptr``, its first ``R`` channels rotated by the
        cos / sin rows, each product and sum rounded to the row's dtype as PyTorch rounds them. The rotated half
        ``rotate_half(x)[i]`` is x's normalized element ``i +- R / 2``, normalized again from a second load (the same
        bits as the first: the row's scale is one number)."""
        half = R // 2
        partner = tl.where(d < half, d + half, d - half)
        x = tl.load(row + d, mask=d < D, other=0.0)
        xp = tl.load(row + partner, mask=d < R, other=0.0)
        w = tl.load(w_ptr + d, mask=d < D, other=0.0)
        wp = tl.load(w_ptr + partner, mask=d < R, other=0.0)
        c = tl.load(cos_row + d, mask=d < R, other=0.0).to(tl.float32)
        s = tl.load(sin_row + d, mask=d < R, other=0.0).to(tl.float32)
        dtype = x.dtype
        xf = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
        n = rounded(xf * rstd * w, dtype)
        npart = rounded(xp.to(tl.float32) * rstd * wp, dtype)
        rot = tl.where(d < half, -npart, npart)
        y = (rounded(n * c, dtype) + rounded(rot * s, dtype)).to(dtype)
        return tl.where(d < R, y, n.to(dtype))

    @triton.jit
    def _qk_norm_rope_prompt_kernel(q_ptr, g_ptr, k_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, qo_ptr, go_ptr, ko_ptr,
                                    eps, T, Hq, Hkv, D, R, sqb, sqt, sqh, sgb, sgt, sgh, skb, skt, skh, scb, sct, ssb,
                                    sst, BLOCK_D: tl.constexpr, HAS_GATE: tl.constexpr):
        """Program ``(b * T + t, h)``: token t's query head ``h < Hq`` (and its gate), else its key head ``h - Hq``."""
        bt = tl.program_id(0)
        b = (bt // T).to(tl.int64)
        t = (bt % T).to(tl.int64)
        h = tl.program_id(1)
        d = tl.arange(0, BLOCK_D)
        in_row = d < D
        if h < Hq:
            row = q_ptr + b * sqb + t * sqt + h.to(tl.int64) * sqh
            w_ptr = wq_ptr
        else:
            row = k_ptr + b * skb + t * skt + (h - Hq).to(tl.int64) * skh
            w_ptr = wk_ptr
        y = _normed_rotated(row, w_ptr, cos_ptr + b * scb + t * sct, sin_ptr + b * ssb + t * sst, d, D, R, eps)
        if h < Hq:
            tl.store(qo_ptr + ((b * Hq + h) * T + t) * D + d, y, mask=in_row)
            if HAS_GATE:
                gv = tl.load(g_ptr + b * sgb + t * sgt + h.to(tl.int64) * sgh + d, mask=in_row, other=0.0)
                tl.store(go_ptr + (b * T + t) * Hq * D + h * D + d, gv, mask=in_row)
        else:
            tl.store(ko_ptr + ((b * Hkv + h - Hq) * T + t) * D + d, y, mask=in_row)

    @triton.jit
    def _qk_norm_rope_kernel(q_ptr, g_ptr, k_ptr, v_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, keys_ptr, values_ptr,
                             pos_ptr, qo_ptr, go_ptr, eps, Hq, D, Dv, R, sqb, sqh, sgb, sgh, skb, skh, svb, svh,
                             scb, ssb, sKb, sKh, sKs, sVb, sVh, sVs,
                             BLOCK_D: tl.constexpr, HAS_GATE: tl.constexpr, PDL: tl.constexpr):
        """Program ``(b, h)``: query head ``h < Hq`` (and its gate), else key and value head ``h - Hq``."""
        pdl_prologue(PDL)
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        d = tl.arange(0, BLOCK_D)
        in_row = d < D
        if h < Hq:
            row = q_ptr + b * sqb + h.to(tl.int64) * sqh
            w_ptr = wq_ptr
        else:
            row = k_ptr + b * skb + (h - Hq).to(tl.int64) * skh
            w_ptr = wk_ptr
        y = _normed_rotated(row, w_ptr, cos_ptr + b * scb, sin_ptr + b * ssb, d, D, R, eps)
        if h < Hq:
            out = (b * Hq + h) * D
            tl.store(qo_ptr + out + d, y, mask=in_row)
            if HAS_GATE:
                gv = tl.load(g_ptr + b * sgb + h.to(tl.int64) * sgh + d, mask=in_row, other=0.0)
                tl.store(go_ptr + out + d, gv, mask=in_row)
        else:
            kh = (h - Hq).to(tl.int64)
            pos = tl.load(pos_ptr)
            vv = tl.load(v_ptr + b * svb + kh * svh + d, mask=d < Dv, other=0.0)
            tl.store(keys_ptr + b * sKb + kh * sKh + pos * sKs + d, y.to(keys_ptr.dtype.element_ty), mask=in_row)
            tl.store(values_ptr + b * sVb + kh * sVh + pos * sVs + d, vv.to(values_ptr.dtype.element_ty), mask=d < Dv)


def qk_norm_rope_step_triton(q: torch.Tensor, gate: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor,
                             q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, cos: torch.Tensor,
                             sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor):
    """Twin of :func:`qk_norm_rope_step`, one launch. q, gate, k and v may be strided views (each head's
    channels contiguous); the weights, cos and sin rows and the cache's channels must be contiguous."""
    _check(q, gate, k, v, q_weight, k_weight, cos, sin, keys, values, pos)
    tensors = (q, k, v, cos, sin, keys, values) + (() if gate is None else (gate,))
    if any(t.stride(-1) != 1 for t in tensors) or not (q_weight.is_contiguous() and k_weight.is_contiguous()):
        raise ValueError("the kernel needs each head's channels, the weights and cos / sin rows contiguous")
    if q_weight.dtype != torch.float32 or k_weight.dtype != torch.float32:
        raise TypeError("the norm weights must be float32 (the formula's weight, e.g. 1 + w)")
    B, Hq, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    query = torch.empty(B, Hq, 1, D, dtype=q.dtype, device=q.device)
    gate_out = None if gate is None else torch.empty(B, Hq * D, dtype=gate.dtype, device=gate.device)
    if B:
        g = gate if gate is not None else q
        launch_kernel(_qk_norm_rope_kernel, (B, Hq + Hkv),
            q, g, k, v, q_weight, k_weight, cos, sin, keys, values, pos, query,
            gate_out if gate_out is not None else query, eps, Hq, D, Dv, cos.shape[-1],
            q.stride(0), q.stride(1), g.stride(0), g.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            cos.stride(0) if B > 1 and cos.shape[0] > 1 else 0, sin.stride(0) if B > 1 and sin.shape[0] > 1 else 0,
            keys.stride(0), keys.stride(1), keys.stride(2),
            values.stride(0), values.stride(1), values.stride(2),
            BLOCK_D=next_power_of_2(max(D, Dv)), HAS_GATE=gate is not None, num_warps=1 if D <= 128 else 2,
            **pdl_launch(q.device, B))
    return query, gate_out


def qk_norm_rope_triton(q: torch.Tensor, gate: torch.Tensor | None, k: torch.Tensor, q_weight: torch.Tensor,
                        k_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor):
    """Twin of :func:`qk_norm_rope_reference`, one launch. q, gate and k may be strided views (each head's channels
    contiguous); the weights (float32) and the cos / sin rows must be contiguous."""
    _check_prompt(q, gate, k, q_weight, k_weight, cos, sin)
    tensors = (q, k, cos, sin) + (() if gate is None else (gate,))
    if any(t.stride(-1) != 1 for t in tensors) or not (q_weight.is_contiguous() and k_weight.is_contiguous()):
        raise ValueError("the kernel needs each head's channels, the weights and cos / sin rows contiguous")
    if q_weight.dtype != torch.float32 or k_weight.dtype != torch.float32:
        raise TypeError("the norm weights must be float32 (the formula's weight, e.g. 1 + w)")
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    query = torch.empty(B, Hq, T, D, dtype=q.dtype, device=q.device)
    key = torch.empty(B, Hkv, T, D, dtype=k.dtype, device=k.device)
    gate_out = None if gate is None else torch.empty(B, T, Hq * D, dtype=gate.dtype, device=gate.device)
    if B and T:
        g = gate if gate is not None else q
        batch_cos = cos.shape[0] > 1
        launch_kernel(_qk_norm_rope_prompt_kernel, (B * T, Hq + Hkv),
            q, g, k, q_weight, k_weight, cos, sin, query, gate_out if gate_out is not None else query, key, eps, T, Hq,
            Hkv, D, cos.shape[-1], *q.stride()[:3], *g.stride()[:3], *k.stride()[:3],
            cos.stride(0) if batch_cos else 0, cos.stride(1), sin.stride(0) if batch_cos else 0, sin.stride(1),
            BLOCK_D=next_power_of_2(D), HAS_GATE=gate is not None, num_warps=1 if D <= 128 else 2)
    return query, key, gate_out
