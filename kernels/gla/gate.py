"""GLA's gate tail: logits -> per-channel log-decay, in one pass; and the whole quantized low-rank
gate (both projections and the tail) in one launch.

Spec (:func:`gate_log_decay`, also the CPU path): the calibrated gate treatment of an int8 gate
(clamp the logits of each channel to its calibrated ``[logit_min, logit_max]``, round them to
int8 with the channel's static scale, back to the logits' dtype), then fla's
``logsigmoid(logits) / normalizer``, optionally clamped below at ``clamp_min``. The Triton kernel
does the same elementwise chain in one launch (PyTorch takes about a dozen).

:func:`low_rank_gate_log_decay_triton`: fla's ``gk_proj`` is ``Linear(hidden, 16)`` then
``Linear(16, key_dim)``; quantized, both are weight-only int8 (W8A16). Spec: the two modules'
W8A16 products (``int8_outlier_linear(..., act_granularity="none")``, each output rounded to x's
dtype as the module returns it), then :func:`gate_log_decay`. The kernel computes the rank-16
intermediate of its rows in registers and goes on to the logits and the tail: one launch instead of
three (the two GEMMs of a decode step are a few kilobytes of weight each: launch-bound).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.launch import launch_kernel
from ..common.numerics import fake_quantize_int8
from ..common.pdl import pdl_launch
from ..common.sizes import cdiv, next_power_of_2

try:
    import triton
    import triton.language as tl

    from ..common.pdl import pdl_prologue
    from ..common.triton_numerics import fake_quantize_int8 as tl_fake_quantize_int8
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def gate_log_decay(logits: torch.Tensor, normalizer: float, clamp_min: float | None = None,
                   logit_min: torch.Tensor | None = None, logit_max: torch.Tensor | None = None,
                   logit_scale: torch.Tensor | None = None) -> torch.Tensor:
    """float32 log-decay ``<= 0`` from gate logits ``[..., C]``; with ``logit_scale`` the logits are
    clamped to their calibrated ``[logit_min, logit_max]`` (when given) and fake-quantized first
    (:func:`~..common.numerics.fake_quantize_int8`)."""
    if logit_scale is not None:
        logits = fake_quantize_int8(logits, logit_scale, logit_min, logit_max)
    gk = F.logsigmoid(logits.float()) / normalizer
    return gk.clamp_min(clamp_min) if clamp_min is not None else gk


if triton is not None:

    @triton.jit
    def _tail_params(cols, mc, lo_ptr, hi_ptr, s_ptr, QUANT: tl.constexpr, BOUNDS: tl.constexpr,
                     PER_CHANNEL: tl.constexpr):
        """The calibrated gate's bounds and scale at columns ``cols`` (placeholders without ``QUANT``), loaded by
        the kernels before their PDL wait: parameters, which the kernel before does not write."""
        lo = 0.0
        hi = 0.0
        s = 1.0
        if QUANT:
            if BOUNDS:
                lo = tl.load(lo_ptr + cols, mask=mc, other=0.0)[None, :]
                hi = tl.load(hi_ptr + cols, mask=mc, other=0.0)[None, :]
            if PER_CHANNEL:
                s = tl.load(s_ptr + cols, mask=mc, other=1.0)[None, :]
            else:
                s = tl.load(s_ptr)
        return lo, hi, s

    @triton.jit
    def _log_decay_tail(raw, lo, hi, s, normalizer, clamp_min, QUANT: tl.constexpr, BOUNDS: tl.constexpr,
                        CLAMP_MIN: tl.constexpr):
        """Logits ``raw`` (a tile of the logits' dtype) -> float32 log-decay, with the bounds and scale of
        :func:`_tail_params`."""
        x = raw.to(tl.float32)  # exact; the bounds and the dequantized logits are rounded to raw's dtype
        if QUANT:
            x = tl_fake_quantize_int8(raw, lo, hi, s, BOUNDS)
        y = (tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))) / normalizer  # logsigmoid
        if CLAMP_MIN:
            y = tl.maximum(y, clamp_min)
        return y

    @triton.jit
    def _gate_log_decay_kernel(x_ptr, lo_ptr, hi_ptr, s_ptr, y_ptr, M, C, s_xm, normalizer, clamp_min,
                               BLOCK_C: tl.constexpr, ROWS: tl.constexpr, QUANT: tl.constexpr, BOUNDS: tl.constexpr,
                               PER_CHANNEL: tl.constexpr, CLAMP_MIN: tl.constexpr, PDL: tl.constexpr = False):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mc = cols < C
        lo, hi, s = _tail_params(cols, mc, lo_ptr, hi_ptr, s_ptr, QUANT, BOUNDS, PER_CHANNEL)
        pdl_prologue(PDL)
        mask = (rows < M)[:, None] & mc[None, :]
        raw = tl.load(x_ptr + rows.to(tl.int64)[:, None] * s_xm + cols[None, :], mask=mask, other=0.0)
        y = _log_decay_tail(raw, lo, hi, s, normalizer, clamp_min, QUANT, BOUNDS, CLAMP_MIN)
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * C + cols[None, :], y, mask=mask)


def gate_log_decay_triton(logits: torch.Tensor, normalizer: float, clamp_min: float | None = None,
                          logit_min: torch.Tensor | None = None, logit_max: torch.Tensor | None = None,
                          logit_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of :func:`gate_log_decay`; ``logits [..., C]`` with rows of one stride."""
    C = logits.shape[-1]
    x = logits.reshape(-1, C)
    if x.stride(-1) != 1:
        x = x.contiguous()
    M = x.shape[0]
    y = torch.empty(*logits.shape[:-1], C, dtype=torch.float32, device=logits.device)
    if M and C:
        block_c = min(1024, next_power_of_2(C))
        rows = max(1, 2048 // block_c)
        ptrs, clamp, consts = _tail_args(y, clamp_min, logit_min, logit_max, logit_scale)
        launch_kernel(_gate_log_decay_kernel, (cdiv(M, rows), cdiv(C, block_c)),
            x, *ptrs, y, M, C, x.stride(0), float(normalizer), clamp, BLOCK_C=block_c, ROWS=rows, num_warps=4, **consts,
            **pdl_launch(x.device, M))
    return y


def _tail_args(y, clamp_min, logit_min, logit_max, logit_scale):
    """The gate tail's pointer arguments (``y`` where absent), clamp value and constexprs."""
    quant = logit_scale is not None
    bounds = quant and logit_min is not None
    ptrs = (logit_min if bounds else y, logit_max if bounds else y, logit_scale if quant else y)
    consts = dict(QUANT=quant, BOUNDS=bounds, PER_CHANNEL=quant and logit_scale.numel() > 1,
                  CLAMP_MIN=clamp_min is not None)
    return ptrs, 0.0 if clamp_min is None else clamp_min, consts


if triton is not None:

    @triton.jit
    def _w8a16_dot(a, w):
        """``a @ w`` for W8A16: the int8 weight tile converted to a's dtype (exact), float32 sums."""
        if a.dtype == tl.float32:
            return tl.dot(a, w.to(tl.float32), input_precision="ieee")
        return tl.dot(a, w.to(a.dtype))

    @triton.jit
    def _low_rank_gate_kernel(x_ptr, w1_ptr, s1_ptr, w2_ptr, s2_ptr, b2_ptr, lo_ptr, hi_ptr, s_ptr, y_ptr,
                              M, K, R, C, s_xm, KQ1, KQ2, normalizer, clamp_min,
                              ROWS: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr, BLOCK_C: tl.constexpr,
                              HAS_BIAS: tl.constexpr, QUANT: tl.constexpr, BOUNDS: tl.constexpr,
                              PER_CHANNEL: tl.constexpr, CLAMP_MIN: tl.constexpr, PDL: tl.constexpr = False):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mr = rows < M
        mc = cols < C
        r = tl.arange(0, BR)
        m_r = r < R
        # the parameters after the K loop are loaded before the PDL wait: their device-memory latency then overlaps
        # the kernel before instead of following the loop
        s1 = tl.load(s1_ptr + r, mask=m_r, other=0.0)[None, :]
        w2 = tl.load(w2_ptr + cols[None, :].to(tl.int64) * KQ2 + r[:, None], mask=m_r[:, None] & mc[None, :], other=0)
        s2 = tl.load(s2_ptr + cols, mask=mc, other=0.0)[None, :]
        if HAS_BIAS:
            b2 = tl.load(b2_ptr + cols, mask=mc, other=0.0).to(tl.float32)[None, :]
        lo, hi, s = _tail_params(cols, mc, lo_ptr, hi_ptr, s_ptr, QUANT, BOUNDS, PER_CHANNEL)
        pdl_prologue(PDL)
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * s_xm
        acc = tl.zeros([ROWS, BR], dtype=tl.float32)
        for k0 in range(0, K, BK):  # the rank-R intermediate of these rows
            kk = k0 + tl.arange(0, BK)
            mk = kk < K
            a = tl.load(x_rows + kk[None, :], mask=mr[:, None] & mk[None, :], other=0.0)
            w = tl.load(w1_ptr + r[None, :] * KQ1 + kk[:, None], mask=mk[:, None] & m_r[None, :], other=0)
            acc = acc + _w8a16_dot(a, w)
        h = (acc * s1).to(x_ptr.dtype.element_ty)
        logits = _w8a16_dot(h, w2) * s2
        if HAS_BIAS:
            logits += b2
        raw = logits.to(x_ptr.dtype.element_ty)
        y = _log_decay_tail(raw, lo, hi, s, normalizer, clamp_min, QUANT, BOUNDS, CLAMP_MIN)
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * C + cols[None, :], y, mask=mr[:, None] & mc[None, :])


def low_rank_gate_config(M: int, x_dtype: torch.dtype) -> dict:
    """Tiles of the fused low-rank gate: each program recomputes the rank-R intermediate of its 16
    rows (a few kilobytes of weight, from L2), so the logits are cut into many narrow column blocks
    at decode sizes: the kernel's time is one program's latency, mostly its K loop, which 1,024-wide
    steps keep short. On an H100 for a 2048 -> 16 -> 1024 gate (eval/results/gate_fused_h100.json):
    5.5-5.9 us at M = 1 and 64, 11.6 us at M = 1024, against 10.9 / 11.0 / 28.5 us for the two W8A16
    GEMMs and the tail. On an H200 (eval/results/gla_7b_h200/gate_sweep/): 4096 -> 16 -> 2048 at M = 64
    8.5 us (11.4 with 256-wide K steps and 32-column blocks), 2048 -> 16 -> 1024 5.4 us."""
    if x_dtype == torch.float32:
        return dict(ROWS=16, BLOCK_C=32 if M <= 256 else 256, BK=64, num_warps=4, num_stages=3)
    if M > 256:
        return dict(ROWS=16, BLOCK_C=256, BK=256, num_warps=4, num_stages=3)
    return dict(ROWS=16, BLOCK_C=32 if M <= 16 else 64, BK=1024, num_warps=4, num_stages=3)


def low_rank_gate_log_decay_triton(x: torch.Tensor, first, second, normalizer: float, clamp_min: float | None = None,
                                   logit_min: torch.Tensor | None = None, logit_max: torch.Tensor | None = None,
                                   logit_scale: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """float32 log-decay ``[..., C]`` from ``x [..., K]`` through two weight-only int8 linears (their
    :class:`~..gemm.int8.PackedOutlierWeight`, ``first``: K -> R <= 64, ``second``: R -> C, neither
    with outlier columns, the first without bias) and the gate tail, in one launch. ``config``: the
    tiles (:func:`low_rank_gate_config` by default)."""
    K, R, C = first.in_features, first.qweight.shape[0], second.qweight.shape[0]
    if first.outlier_idx.numel() or second.outlier_idx.numel() or first.bias is not None:
        raise ValueError("the fused low-rank gate takes int8 linears without outlier columns, the first without bias")
    if second.in_features != R or R > 64 or x.shape[-1] != K:
        raise ValueError(f"low-rank gate shapes do not chain: x {tuple(x.shape)}, {K} -> {R} -> "
                         f"{second.in_features} -> {C} (rank <= 64)")
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    y = torch.empty(*x.shape[:-1], C, dtype=torch.float32, device=x.device)
    if M and C:
        cfg = dict(config or low_rank_gate_config(M, x2.dtype))
        rows, block_c = cfg.pop("ROWS"), min(cfg.pop("BLOCK_C"), max(16, next_power_of_2(C)))
        ptrs, clamp, consts = _tail_args(y, clamp_min, logit_min, logit_max, logit_scale)
        launch_kernel(_low_rank_gate_kernel, (cdiv(M, rows), cdiv(C, block_c)),
            x2, first.qweight, first.scale, second.qweight, second.scale,
            second.bias if second.bias is not None else y, *ptrs, y,
            M, K, R, C, x2.stride(0), first.qweight.shape[1], second.qweight.shape[1], float(normalizer), clamp,
            ROWS=rows, BR=max(16, next_power_of_2(R)), BLOCK_C=block_c, HAS_BIAS=second.bias is not None,
            **consts, **cfg, **pdl_launch(x.device, M))
    return y
