"""Triton device functions for laquant's numerics: the in-kernel twin of :mod:`.numerics`.

Every Triton kernel quantizes through these, so the rounding rules live in one place per language:
symmetric absmax scales (``absmax / qmax``, at least float32's tiny), ``x / scale`` as an exactly
rounded division (``div_rn``, as PyTorch divides; the activation codes a kernel stores get the same quotient from
the row's reciprocal and one residual step, :func:`stored_int8_codes`; states use a per-row reciprocal, see
:func:`encode_state`), int8 rounded half to even (as ``torch.round``, :func:`int8_codes`)
and clamped to +-127, fp8 e4m3 clamped to +-448 then cast (round to nearest even). Format codes
(``FMT``) are the registry's ``kernel_code`` (:mod:`.formats`): 0 fp32, 1 bf16, 2 fp8 e4m3 and 3 int8,
the scaled ones with one float32 scale per K row.

Stochastic rounding (``SR``): :func:`state_random_bytes` draws one random byte per state element
from ``tl.philox`` with the counters of :func:`laquant.kernels.common.state.state_random_bytes`
(one Philox call of ``STATE_PHILOX_ROUNDS`` rounds per 16 elements of a row), and :func:`round_stochastic_fp8` /
:func:`round_stochastic_int` round with it exactly as their twins in :mod:`.numerics` do. The int8
state is encoded and decoded on float32's bit patterns (integer adds and logic, no conversions), which
give the same codes and values as the conversions.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

if triton is not None:
    from .numerics import STATE_PHILOX_ROUNDS
    from .pdl import pdl_wait

    PHILOX_ROUNDS = tl.constexpr(STATE_PHILOX_ROUNDS)

    # Triton folds ``x.to(tl.bfloat16).to(tl.float32)`` back to x (and may contract the product before it
    # into an FMA): on an H200 (Triton 3.6) 24% of ``bf16(bf16(a * b) + bf16(c * d))`` differed from
    # PyTorch's. :func:`rounded` rounds with a PTX conversion instead, which nothing folds; the interpreter
    # (no inline PTX) rounds as written, and so does ROCm (no PTX there).
    PTX_ROUNDING = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1" and torch.version.hip is None)

    @triton.jit
    def rounded(x, dtype: tl.constexpr):
        """float32 ``x`` rounded to ``dtype`` (to nearest, ties to even, as PyTorch's casts), returned in
        float32: the rounding a PyTorch op's output in ``dtype`` gets, kept where the next op reads it."""
        if PTX_ROUNDING and dtype == tl.bfloat16:
            out = tl.inline_asm_elementwise("cvt.rn.bf16.f32 $0, $1;", "=h,r", [x.to(tl.float32)],
                                            dtype=tl.bfloat16, is_pure=True, pack=1).to(tl.float32)
        elif PTX_ROUNDING and dtype == tl.float16:
            out = tl.inline_asm_elementwise("cvt.rn.f16.f32 $0, $1;", "=h,r", [x.to(tl.float32)],
                                            dtype=tl.float16, is_pure=True, pack=1).to(tl.float32)
        else:
            out = x.to(dtype).to(tl.float32)
        return out

    @triton.jit
    def exp_as_torch(x):
        """``exp`` of float32 ``x`` as PyTorch's CUDA kernels compute it (CUDA's ``expf``: libdevice's ``__nv_expf``),
        where ``tl.exp`` is the faster ``ex2.approx`` (an ulp or two off). The interpreter (no libdevice) and ROCm
        take ``tl.exp``."""
        if PTX_ROUNDING:
            out = libdevice.exp(x)
        else:
            out = tl.exp(x)
        return out

    @triton.jit
    def mm(a, b, LOW_PRECISION: tl.constexpr, TF32X3: tl.constexpr = False):
        """``a @ b`` with float32 accumulation: bf16 operands (tensor cores, as fla) when
        ``LOW_PRECISION``, else float32 products: on the tensor cores as three TF32 products (``tf32x3``,
        float32's accuracy, not its exact rounding) when ``TF32X3``, else exact (``ieee``)."""
        if LOW_PRECISION:
            out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
        elif TF32X3:
            out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32x3")
        else:
            out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return out

    @triton.jit
    def dot_f32(a, b, LOW_PRECISION: tl.constexpr):
        """``a @ b`` of float32 tiles to float32's accuracy: on the tensor cores as three TF32 products
        (``tf32x3``) when ``LOW_PRECISION`` (the inputs were bf16), else exact float32 products (``ieee``)."""
        if LOW_PRECISION:
            out = tl.dot(a, b, input_precision="tf32x3")
        else:
            out = tl.dot(a, b, input_precision="ieee")
        return out

    @triton.jit
    def tile_row(x, rows, r):
        """Row ``r`` of a 2-D tile (``rows`` indexes its first dimension)."""
        return tl.sum(tl.where((rows == r)[:, None], x, 0.0), axis=0)

    @triton.jit
    def chunk_decay_splits(G, rows, T):
        """Whether :func:`decayed_scores` may split this chunk's decays around its middle row: each factor is at
        most the chunk's whole decay ``exp(G_0 - G_last)`` in a channel, which must stay within ``exp(60)`` (else a
        factor could overflow float32: inf, then NaN)."""
        return tl.max(tile_row(G, rows, 0) - tile_row(G, rows, T - 1), axis=0) <= 60.0

    @triton.jit
    def decayed_scores(a, a2, b, G, rows, T, BT: tl.constexpr, PAIR: tl.constexpr, LOW_PRECISION: tl.constexpr):
        """``[BT, BT]`` tiles ``sum_k a[t, k] b[s, k] exp(G[t, k] - G[s, k])`` for ``s <= t < T`` (0 elsewhere), and
        the same with ``a2`` for ``a`` when ``PAIR`` (else zeros): the decayed scores of one chunk of ``T`` tokens,
        ``G`` their cumulative log-decays (non-increasing down the rows; the padding rows repeat row ``T - 1``'s).
        As in a prefill chunk, ``exp(G_t - G_s)`` splits around the row ``r = T // 2`` into ``exp(G_t - G_r)`` on the
        ``a`` side and ``exp(G_r - G_s)`` on the ``b`` side, products on the tensor cores (:func:`mm`). Only where
        :func:`chunk_decay_splits`."""
        g_ref = tile_row(G, rows, T // 2)
        b_side = tl.trans(b * tl.exp(g_ref[None, :] - G))
        up = tl.exp(G - g_ref[None, :])
        causal = (rows[:, None] >= rows[None, :]) & (rows < T)[:, None]
        A = tl.where(causal, mm(a * up, b_side, LOW_PRECISION, True), 0.0)
        A2 = tl.zeros([BT, BT], dtype=tl.float32)
        if PAIR:
            A2 = tl.where(causal, mm(a2 * up, b_side, LOW_PRECISION, True), 0.0)
        return A, A2

    @triton.jit
    def unit_lower_inverse_by_squaring(A, rows, T):
        """``(I + A)^-1`` of a strictly lower-triangular ``[BT, BT]`` tile ``A`` nonzero in its first ``T`` rows only
        (so ``A^T = 0``): ``(I - A)(I + A^2)(I + A^4)...``, the factors up to ``A^(T/2)``, float32-accurate
        tensor-core products (:func:`dot_f32`). For one chunk of a few tokens: 2 (T <= 4) to 6 (T <= 16) products,
        where :func:`unit_lower_inverse`'s forward substitution takes BT - 1 dependent steps of row reductions."""
        eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
        X = eye - A
        power = A
        span = 2
        while span < T:
            power = dot_f32(power, power, True)
            X = dot_f32(X, eye + power, True)
            span *= 2
        return X

    @triton.jit
    def unit_lower_inverse(A, rows, BT: tl.constexpr, LOW_PRECISION: tl.constexpr):
        """``(I + A)^-1`` of a strictly lower-triangular ``[BT, BT]`` tile ``A`` (float32).

        Up to 16 rows, by forward substitution: ``I + L`` with row i of L ``-a_i - a_i L`` (``a_i`` row i of A).
        Larger tiles by 16-row blocks: the diagonal blocks' inverses ``Bd`` by forward substitution, all blocks
        at once (``[BT / 16, 16, 16]``, each step's row reductions inside a block), then, with ``Al`` the part
        of A below the diagonal blocks, ``(I + A) = (I + Ad)(I + M)``, ``M = Bd Al`` strictly block-lower (so
        ``M^(BT / 16) = 0``): ``(I + A)^-1 = (I - M + M^2 - M^3) Bd`` as float32-accurate tensor-core products
        (:func:`dot_f32`). A 64-row forward substitution row by row was 7x slower (H200)."""
        if BT <= 16:
            L = tl.zeros([BT, BT], dtype=tl.float32)
            for i in tl.static_range(1, BT):
                a_i = tile_row(A, rows, i)
                l_i = -a_i - tl.sum(a_i[:, None] * L, axis=0)
                L = tl.where((rows == i)[:, None], l_i[None, :], L)
            X = L + tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
        else:
            NB: tl.constexpr = BT // 16
            same_block = tl.arange(0, NB)[:, None, None, None] == tl.arange(0, NB)[None, None, :, None]
            A3 = tl.sum(tl.where(same_block, tl.reshape(A, [NB, 16, NB, 16]), 0.0), axis=2)  # the diagonal blocks
            r3 = tl.arange(0, 16)[None, :, None]
            L3 = tl.zeros([NB, 16, 16], dtype=tl.float32)
            for i in tl.static_range(1, 16):
                a_i = tl.sum(tl.where(r3 == i, A3, 0.0), axis=1)  # [NB, 16]: row i of every block
                l_i = -a_i - tl.sum(a_i[:, :, None] * L3, axis=1)
                L3 = tl.where(r3 == i, l_i[:, None, :], L3)
            L3 = L3 + tl.where(r3 == tl.arange(0, 16)[None, None, :], 1.0, 0.0)
            Bd = tl.reshape(tl.where(same_block, tl.broadcast_to(tl.reshape(L3, [NB, 16, 1, 16]), [NB, 16, NB, 16]),
                                     0.0), [BT, BT])
            M = dot_f32(Bd, tl.where((rows // 16)[:, None] > (rows // 16)[None, :], A, 0.0), LOW_PRECISION)
            X = Bd - dot_f32(M, Bd, LOW_PRECISION)  # (I - M) Bd
            if NB > 2:
                X = X + dot_f32(dot_f32(M, M, LOW_PRECISION), X, LOW_PRECISION)  # (I + M^2)(I - M) Bd
        return X

    @triton.jit
    def absmax_row_scale(x, QMAX: tl.constexpr):
        """One scale per row of a 2-D tile."""
        return tl.maximum(tl.max(tl.abs(x), axis=1) / QMAX, 1.1754943508222875e-38)  # float32 tiny

    @triton.jit
    def stored_row_scale(st, old_scale, static_ptrs, mask_k, renorm_now, RENORM: tl.constexpr, QMAX: tl.constexpr):
        """The per-row scale a decode step stores ``st`` with (scaled formats; the kernel twin of
        :meth:`~laquant.kernels.common.state.StateQuantizer.store` on a pool slot): the calibrated static
        scales at ``static_ptrs`` when ``RENORM`` is 0; else the fresh absmax, which with
        ``RENORM > 1`` only grows (``max`` with ``old_scale``) except when ``renorm_now``."""
        if RENORM == 0:
            scale = tl.load(static_ptrs, mask=mask_k, other=1.0)
        else:
            scale = absmax_row_scale(st, QMAX)
            if RENORM > 1:
                scale = tl.where(renorm_now, scale, tl.maximum(scale, old_scale))
        return scale

    @triton.jit
    def decayed_update(S, decay, k, u):
        """``S * decay[:, None] + k[:, None] * u[None, :]``, the recurrent state's step, with one
        explicit FMA per element: left to itself, ptxas contracts one product or the other into an
        FMA depending on the kernel around it, and the decode and verify kernels must store the
        same bits."""
        return tl.fma(tl.broadcast_to(k[:, None], S.shape), tl.broadcast_to(u[None, :], S.shape), S * decay[:, None])

    @triton.jit
    def int8_codes(y):
        """``y`` rounded half to even and clamped to +-127, as int8 (``torch.round``, then clamp).
        Adding ``1.5 * 2**23`` to the clamped value rounds it to an integer, half to even, and
        subtracting it again is exact: two adds instead of a floor and a tie test (the int8 state's
        nearest-rounding decode kernels ran 1.3-1.4x faster, eval/results/int8_codes_h200.md). The
        integer-valued float is then converted: narrowing the add's bit pattern instead broke the
        codes a GEMM feeds straight to ``tl.dot`` on the GPU."""
        return ((tl.minimum(tl.maximum(y, -127.0), 127.0) + 12582912.0) - 12582912.0).to(tl.int8)

    @triton.jit
    def fp8_codes(y):
        return tl.minimum(tl.maximum(y, -448.0), 448.0).to(tl.float8e4nv)

    @triton.jit
    def quantize_int8(x, scale):
        """int8 codes of ``x / scale`` (``scale`` broadcast to ``x``), exactly as PyTorch rounds them."""
        return int8_codes(tl.math.div_rn(x, scale))

    @triton.jit
    def stored_int8_codes(x, scale):
        """The codes of PyTorch's ``round(x / scale).clamp(-127, 127)``, bit for bit, as :func:`quantize_int8`
        gives them, in about a third of its instructions, for a kernel that stores them (``scale`` a scalar, or
        per row broadcastable to ``x``, e.g. ``[R, 1]``; an absmax scale, at most float32's max / 127): a 4,096 x
        5,632 SwiGLU writing its codes spent ~30% of its time in ``div_rn`` and the float -> int conversion.
        Two differences from :func:`quantize_int8`, neither in a finite model's rows: on the GPU ``div_rn`` flushes
        subnormal ``x`` to zero (Triton's ftz) where this keeps PyTorch's code (rows with absmax under ~3e-36); and
        a row with an infinite scale (an inf among its kept columns) gets -127 everywhere here, 0 for its finite
        elements there, its GEMM output not finite either way.

        The quotient is the exactly rounded ``x / scale`` from the row's reciprocal ``r = RN(1 / d)``: ``q = RN(x
        r)`` is within an ulp of ``x / d``, the residual ``x - d q`` is exact in an fma, and ``RN(q + (x - d q)
        r)`` is then ``RN(x / d)`` (Markstein's theorem). Rows with scales under 2**-90 are scaled by 2**64
        first, exactly, so that the residual stays clear of float32's subnormals for every quotient that can
        round to a nonzero code; the first quotient is clamped to +-128 (past the codes' range the step only has to
        keep its side, and an overflow would make it NaN). The clamped quotient becomes int8 from float32's bits
        (:func:`int8_codes` converts instead: its codes may feed ``tl.dot``, which the narrowed bits broke)."""
        up = tl.where(scale < 8.077935669463161e-28, 18446744073709551616.0, 1.0)  # 2**-90, 2**64
        d = scale * up
        r = tl.math.div_rn(1.0, d)
        xs = x * up
        q = tl.minimum(tl.maximum(xs * r, -128.0), 128.0)
        q = tl.fma(tl.fma(tl.broadcast_to(-d, x.shape), q, xs), tl.broadcast_to(r, x.shape), q)
        y = tl.minimum(tl.maximum(q, -127.0), 127.0)
        return ((y + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000).to(tl.int8)

    @triton.jit
    def fake_quantize_int8(raw, lo, hi, scale, BOUNDS: tl.constexpr):
        """Twin of ``numerics.fake_quantize_int8`` (calibrated gate logits): ``raw``, a tile in the
        logits' dtype, clamped to ``[lo, hi]`` (rounded to raw's dtype) when ``BOUNDS``, rounded to int8
        with the static ``scale`` and back to raw's dtype; returned in float32 (exact)."""
        x = raw.to(tl.float32)
        if BOUNDS:
            x = tl.maximum(tl.minimum(x, rounded(hi, raw.dtype)), rounded(lo, raw.dtype))
        return rounded(quantize_int8(x, scale).to(tl.float32) * scale, raw.dtype)

    @triton.jit
    def load_treated_logits(ptr, lo_ptr, hi_ptr, s_ptr, offs, p_offs, mask, QUANT: tl.constexpr,
                            BOUNDS: tl.constexpr, PER_CHANNEL: tl.constexpr):
        """The logits at ``ptr + offs``, given a calibrated gate's treatment when ``QUANT`` (its parameters at
        ``p_offs``; launch arguments: ``gate_treatment.treatment_args``), float32."""
        raw = tl.load(ptr + offs, mask=mask, other=0.0)
        if not QUANT:
            return raw.to(tl.float32)
        lo = 0.0
        hi = 0.0
        if BOUNDS:
            lo = tl.load(lo_ptr + p_offs, mask=mask, other=0.0)
            hi = tl.load(hi_ptr + p_offs, mask=mask, other=0.0)
        if PER_CHANNEL:
            s = tl.load(s_ptr + p_offs, mask=mask, other=1.0)
        else:
            s = tl.load(s_ptr)
        return fake_quantize_int8(raw, lo, hi, s, BOUNDS)

    @triton.jit
    def store_codes(y, col, ok, xq_row, xs_out, n_keep, KQ):
        """W8A8's activation codes of one token held in registers, for a GEMM that keeps every input
        column in order (no outliers: ``PackedOutlierWeight.identity``): ``y`` (float32, the values as
        the model dtype holds them) at input columns ``col`` (any tile shape; ``ok`` marks the real
        elements, zeros elsewhere). The absmax gives the scale; the ``n_keep`` columns are stored as int8,
        the padding after them (up to ``KQ``) as zeros."""
        scale = tl.maximum(tl.max(tl.abs(y)) / 127.0, 1.1754943508222875e-38)
        tl.store(xs_out, scale)
        tl.store(xq_row + col, stored_int8_codes(y, scale), mask=ok)
        pad = n_keep + tl.arange(0, 16)
        tl.store(xq_row + pad, tl.zeros([16], dtype=tl.int8), mask=pad < KQ)

    @triton.jit
    def store_scattered_codes(y, dest, ok, xq_row, xs_out, xo_row, n_keep, KQ, NO, n_out):
        """W8A8's activation codes of one token held in registers, for a GEMM with outlier columns,
        without reading the row back: ``y`` (float32, the values as the model dtype holds them) at input
        columns whose ``dest`` (``PackedOutlierWeight.dest`` loaded at those columns, any tile shape) is
        the kept column's packed position (>= 0) or ``-1 - slot`` of an outlier column. The absmax over the
        kept columns gives the scale; the codes are scattered to their packed positions (byte stores:
        faster than a read-back at decode sizes, 2-2.5x slower at 4,096 tokens), the outlier values to
        their slot of the dense block, whose padding slots (``n_out .. NO``) and the codes' (``n_keep ..
        KQ``) get zeros. The same codes, scale and outlier values as :func:`store_token_codes` (which fills the
        block's padding with copies of the last outlier column instead: their weights are zero either way)."""
        kept = ok & (dest >= 0)
        scale = tl.maximum(tl.max(tl.where(kept, tl.abs(y), 0.0)) / 127.0, 1.1754943508222875e-38)
        tl.store(xs_out, scale)
        tl.store(xq_row + dest, stored_int8_codes(y, scale), mask=kept)
        pad = n_keep + tl.arange(0, 16)
        tl.store(xq_row + pad, tl.zeros([16], dtype=tl.int8), mask=pad < KQ)
        store_outlier_slots(y, dest, ok, xo_row, NO, n_out)

    @triton.jit
    def store_outlier_slots(y, dest, ok, xo_row, NO, n_out):
        """A token's outlier values held in registers (``y`` at columns whose ``dest`` is ``-1 - slot``) to their
        slots of the dense outlier block at ``xo_row``; its padding slots (``n_out .. NO``) get zeros."""
        tl.store(xo_row + (-1 - dest), y.to(xo_row.dtype.element_ty), mask=ok & (dest < 0))
        opad = n_out + tl.arange(0, 16)
        tl.store(xo_row + opad, tl.zeros([16], dtype=xo_row.dtype.element_ty), mask=opad < NO)

    @triton.jit
    def row_absmax_scales(v):
        """The int8 absmax scale of each row of ``v [R, C]`` (float32, zeros where nothing counts), as
        ``numerics.absmax_scale`` rounds it: ``div_rn``, since a vector's ``/ 127.0`` compiles to an approximate
        division on the GPU, an ulp off PyTorch's."""
        return tl.maximum(tl.math.div_rn(tl.max(tl.abs(v), axis=1), 127.0), 1.1754943508222875e-38)

    @triton.jit
    def store_group_codes(y, kept, xq_row, xs_row, KQ, BLOCK: tl.constexpr, GROUP: tl.constexpr):
        """Per-group W8A8 codes (``act_granularity: per_group``) of ``BLOCK`` consecutive input columns of one token
        held in registers (``y`` float32, the values as the model dtype holds them, ``[BLOCK]`` or ``[1, BLOCK]``;
        ``BLOCK`` a multiple of ``GROUP``), a per-group weight's columns in order: ``kept`` marks the columns whose
        codes count (the outlier columns and the padding are zeros). One scale per ``GROUP`` columns at ``xs_row``
        (the exactly rounded ``absmax / 127``, as ``numerics.quantize_int8_groups``), the codes at ``xq_row`` (up to
        ``KQ`` columns from it)."""
        v = tl.reshape(tl.where(kept, y, 0.0), [BLOCK // GROUP, GROUP])
        store_group_tile(v, tl.reshape(tl.arange(0, BLOCK), [BLOCK // GROUP, GROUP]), tl.arange(0, BLOCK // GROUP),
                         xq_row, xs_row, KQ, GROUP)

    @triton.jit
    def store_group_token(y, col, g, ok, dest, tok, xq_ptr, xs_ptr, xo_ptr, KQ, NO, n_out, GROUP: tl.constexpr):
        """Token ``tok``'s per-group W8A8 codes of a tile of whole groups held a group a row (``y [G, GROUP]`` float32,
        the values as the model dtype holds them, at input columns ``col``, groups ``g``; ``dest``: the weight's
        column map loaded at them, ``-1 - slot`` at an outlier column): codes and scales (:func:`store_group_tile`),
        the outlier values to their slots (:func:`store_outlier_slots`)."""
        t64 = tok.to(tl.int64)
        store_group_tile(tl.where(ok & (dest >= 0), y, 0.0), col, g, xq_ptr + t64 * KQ,
                         xs_ptr + t64 * tl.cdiv(KQ, GROUP), KQ, GROUP)
        store_outlier_slots(y, dest, ok, xo_ptr + t64 * NO, NO, n_out)

    @triton.jit
    def store_group_tile(v, col, g, xq_row, xs_row, KQ, GROUP: tl.constexpr):
        """Per-group W8A8 codes of a tile of whole groups of one token, a group a row: ``v [G, GROUP]`` float32 (zeros
        where no code counts), at input columns ``col [G, GROUP]``, groups ``g [G]``: each row's scale at
        ``xs_row + g``, the codes at ``xq_row + col`` (those below ``KQ``)."""
        scale = row_absmax_scales(v)
        tl.store(xs_row + g, scale, mask=g * GROUP < KQ)
        tl.store(xq_row + col, stored_int8_codes(v, scale[:, None]), mask=col < KQ)

    @triton.jit
    def token_code_map(source_ptr, idx_ptr, KQ, NO, BK: tl.constexpr, BNO: tl.constexpr, HAS_OUT: tl.constexpr):
        """``(src, idx)`` for :func:`store_token_codes`: the input column of each int8 column (-1 in the
        padding) and the outlier columns. A kernel loads them first (before its PDL wait too): they do
        not depend on the previous kernel, and the codes' read-back then waits on one round trip, not
        two."""
        offs = tl.arange(0, BK)
        src = tl.load(source_ptr + offs, mask=offs < KQ, other=-1)
        if HAS_OUT:
            offs_o = tl.arange(0, BNO)
            idx = tl.load(idx_ptr + offs_o, mask=offs_o < NO, other=0)
        else:
            idx = tl.zeros([BNO], dtype=tl.int32)
        return src, idx

    @triton.jit
    def store_token_codes(row, src, idx, xq_row, xs_out, xo_row, KQ, NO, BK: tl.constexpr,
                          BNO: tl.constexpr, HAS_OUT: tl.constexpr, FROM_L2: tl.constexpr = False):
        """W8A8's activation codes of one token's ``row`` in memory (``BK >= KQ``), for any GEMM: the
        absmax over the kept columns (``src``, ``idx``: :func:`token_code_map`) gives its scale, the kept
        columns are stored as int8 in the weight's packed order, the outlier columns copied to a dense
        block. (Scattering codes from registers to their packed positions instead measured 2-2.5x
        slower at 4,096 tokens; gathering them inside the program with ``tl.gather``, 0.56-0.92x.)
        ``FROM_L2``: the row is read past the L1 cache (other programs of this launch wrote it)."""
        offs = tl.arange(0, BK)
        cache: tl.constexpr = ".cg" if FROM_L2 else ""
        x = tl.load(row + src, mask=src >= 0, other=0.0, cache_modifier=cache).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0) / 127.0, 1.1754943508222875e-38)
        tl.store(xs_out, scale)
        tl.store(xq_row + offs, stored_int8_codes(x, scale), mask=offs < KQ)
        if HAS_OUT:
            offs_o = tl.arange(0, BNO)
            mo = offs_o < NO
            tl.store(xo_row + offs_o, tl.load(row + idx, mask=mo, other=0.0, cache_modifier=cache), mask=mo)

    @triton.jit
    def state_random_bytes(seed, slot, position, sub, h, offs_k, v0, K: tl.constexpr, V: tl.constexpr,
                           BK: tl.constexpr, BV: tl.constexpr):
        """The random bytes (int32, 0..255) of a stochastic store of the state tile rows
        ``offs_k``, columns ``v0 .. v0 + BV`` of head ``h`` in ``slot``, store ``position``,
        sub-store ``sub``: byte ``v % 16`` of ``philox(seed, (h*K + k) * ceil(V/16) + v // 16,
        slot, position, sub)``."""
        GROUPS: tl.constexpr = (V + 15) // 16
        rows = (h * K + offs_k) * GROUPS
        if BV >= 16:  # one Philox call per 16 elements, its four words spread over them
            c0 = (rows[:, None] + (v0 // 16 + tl.arange(0, BV // 16))[None, :]).to(tl.uint32)
            zero = c0 * 0
            w0, w1, w2, w3 = tl.philox(seed, c0, (zero + slot).to(tl.uint32), (zero + position).to(tl.uint32),
                                       (zero + sub).to(tl.uint32), PHILOX_ROUNDS)
            words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), [BK, BV // 16, 4])
            shifts = (tl.arange(0, 4) * 8).to(tl.uint32)
            out = tl.reshape((words[:, :, :, None] >> shifts[None, None, None, :]) & 0xFF, [BK, BV])
        else:  # rows shorter than 16: one call per element, its byte picked
            offs_v = v0 + tl.arange(0, BV)
            c0 = (rows[:, None] + (offs_v // 16)[None, :]).to(tl.uint32)
            zero = c0 * 0
            w0, w1, w2, w3 = tl.philox(seed, c0, (zero + slot).to(tl.uint32), (zero + position).to(tl.uint32),
                                       (zero + sub).to(tl.uint32), PHILOX_ROUNDS)
            word = (offs_v % 16 // 4)[None, :]
            picked = tl.where(word == 0, w0, tl.where(word == 1, w1, tl.where(word == 2, w2, w3)))
            out = (picked >> ((offs_v % 4) * 8).to(tl.uint32)[None, :]) & 0xFF
        return out.to(tl.int32)

    @triton.jit
    def round_stochastic_int(y, r):
        """``y`` (``|y| <= 127``) rounded down or up to an integer with the random byte ``r`` (int32):
        ``floor(round(256 * y) / 256 + r / 256)``, as ``numerics.round_stochastic_int`` (whose docstring says
        how). Returns int32, computed on float32's bits with integer operations: the conversion units (floor,
        int <-> float) made the int8 state's decode step conversion-bound."""
        return ((y + 32896.0).to(tl.int32, bitcast=True) + r - 0x47008000) >> 8

    @triton.jit
    def round_stochastic_fp8(y, r):
        """``y`` (``|y| <= 448``) rounded towards a neighbouring e4m3 value with the random byte
        ``r``, on float32's bits, as ``numerics.round_stochastic_fp8`` (whose docstring says why)."""
        return ((y.to(tl.int32, bitcast=True) + ((r << 12) + 2048)) & -1048576).to(tl.float32, bitcast=True)

    @triton.jit
    def encode_state(st, scale, FMT: tl.constexpr, SR: tl.constexpr, rbits, BOUNDED: tl.constexpr = False):
        """A float32 state tile in storage format ``FMT`` (``scale`` per row, scaled formats only),
        rounded to nearest, or stochastically with the random bytes ``rbits`` when ``SR``.

        Scaled formats multiply by the row's reciprocal scale instead of dividing every element
        (an exact division per element made the decode step compute-bound): one rounding more
        than PyTorch's ``x / scale``, so a code can differ by one step where ``x / scale`` lies
        within an ulp of a rounding boundary.

        ``BOUNDED`` (int8): the scale is at least the row's absmax / 127 (dynamic scales), so ``|x * (1 / scale)|``
        exceeds 127 by three float32 roundings at most (< 127 + 2**-9), which both roundings take to 127 as
        the clamp would: the clamp is left out (two instructions of the int8 decode step's ~25 an element, 7-8%
        of its time on an H200, eval/results/verify_numerics_h200/)."""
        if FMT == 0:
            out = st
        elif FMT == 1:
            out = st.to(tl.bfloat16, fp_downcast_rounding="rtne")
        elif FMT == 2:
            y = st * tl.math.div_rn(1.0, scale)[:, None]
            if SR:
                out = round_stochastic_fp8(tl.minimum(tl.maximum(y, -448.0), 448.0), rbits).to(tl.float8e4nv)
            else:
                out = fp8_codes(y)
        else:  # int8, rounded on float32's bits (int8_codes' add, without its conversion: see round_stochastic_int)
            y = st * tl.math.div_rn(1.0, scale)[:, None]
            if not BOUNDED:
                y = tl.minimum(tl.maximum(y, -127.0), 127.0)
            if SR:
                n = round_stochastic_int(y, rbits)
            else:
                n = (y + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000
            out = n.to(tl.int8)
        return out

    @triton.jit
    def decode_state(data, scale, FMT: tl.constexpr):
        """The float32 tile a stored tile stands for. int8 codes ``c`` by their bits: ``(c + 128) |
        0x4B000000`` is the float32 ``2**23 + 128 + c``, integer operations where a conversion costs more."""
        if FMT == 3:
            st = (data.to(tl.uint8, bitcast=True).to(tl.int32) ^ 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
        else:
            st = data.to(tl.float32)
        if FMT >= 2:
            st = st * scale[:, None]
        return st

    @triton.jit
    def roundtrip_state(st, static, FMT: tl.constexpr, STATIC: tl.constexpr, QMAX: tl.constexpr,
                        SR: tl.constexpr, rbits):
        """Store then load: what a state kept in ``FMT`` still holds, with the row scales
        ``static`` when ``STATIC``, else fresh per-row absmax scales (``SR``: rounded with ``rbits``)."""
        if FMT == 0:
            out = st
        else:
            scale = static
            if not STATIC:
                scale = absmax_row_scale(st, QMAX)
            out = decode_state(encode_state(st, scale, FMT, SR, rbits), scale, FMT)
        return out

    @triton.jit
    def load_stored_rows(data_ptrs, scale_ptrs, mask_k, mask, FMT: tl.constexpr, BLOCK_K: tl.constexpr):
        """A stored ``[BLOCK_K, V]`` state tile as stored (not decoded), and its row scales (1 for the plain
        formats): what a decode kernel loads before its PDL wait and decodes after it."""
        scale = tl.full([BLOCK_K], 1.0, tl.float32)
        if FMT >= 2:
            scale = tl.load(scale_ptrs, mask=mask_k, other=1.0)
        return tl.load(data_ptrs, mask=mask, other=0.0), scale

    @triton.jit
    def load_state_rows(data_ptrs, scale_ptrs, mask_k, mask, FMT: tl.constexpr, BLOCK_K: tl.constexpr):
        """A stored ``[BLOCK_K, V]`` state tile as float32, and its row scales (1 for the plain formats)."""
        raw, scale = load_stored_rows(data_ptrs, scale_ptrs, mask_k, mask, FMT, BLOCK_K)
        return decode_state(raw, scale, FMT), scale

    @triton.jit
    def head_state_rows(state_ptr, scale_ptr, slot, h, k0, offs_v, mask_v, s_sp, s_sh, s_sk, s_cp, s_ch, K,
                        BLOCK_K: tl.constexpr, FMT: tl.constexpr):
        """Rows ``k0 .. k0 + BLOCK_K`` of head ``h``'s state in pool slot ``slot``, as stored, and their row scales
        (:func:`load_stored_rows`)."""
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        return load_stored_rows(state_ptr + slot * s_sp + h * s_sh + offs_k[:, None] * s_sk + offs_v[None, :],
                                scale_ptr + slot * s_cp + h * s_ch + offs_k, mask_k,
                                mask_k[:, None] & mask_v[None, :], FMT, BLOCK_K)

    @triton.jit
    def wait_with_first_rows(PDL: tl.constexpr, EARLY_STATE: tl.constexpr, idx_ptr, b, state_ptr, scale_ptr, h,
                             offs_v, mask_v, s_sp, s_sh, s_sk, s_cp, s_ch, K, BLOCK_K: tl.constexpr,
                             FMT: tl.constexpr):
        """A decode kernel's PDL wait, with sequence ``b``'s pool slot and head ``h``'s first ``BLOCK_K`` state rows
        (:func:`head_state_rows`) loaded before it when ``EARLY_STATE`` (their latency then overlaps the kernel
        before, which must not write the pool), else after it. Returns ``(slot, rows as stored, row scales)``."""
        if EARLY_STATE:
            slot = tl.load(idx_ptr + b).to(tl.int64)
            raw, scale = head_state_rows(state_ptr, scale_ptr, slot, h, 0, offs_v, mask_v, s_sp, s_sh, s_sk, s_cp,
                                         s_ch, K, BLOCK_K, FMT)
        pdl_wait(PDL)
        if not EARLY_STATE:
            slot = tl.load(idx_ptr + b).to(tl.int64)
            raw, scale = head_state_rows(state_ptr, scale_ptr, slot, h, 0, offs_v, mask_v, s_sp, s_sh, s_sk, s_cp,
                                         s_ch, K, BLOCK_K, FMT)
        return slot, raw, scale

    @triton.jit
    def store_state_rows(st, data_ptrs, scale_ptrs, mask_k, mask, scale, FMT: tl.constexpr, SR: tl.constexpr,
                         rbits, BOUNDED: tl.constexpr = False):
        """Store a float32 state tile in ``FMT`` with these row scales (kept too, scaled formats),
        stochastically rounded with the bytes ``rbits`` when ``SR`` (``BOUNDED``: see :func:`encode_state`)."""
        tl.store(data_ptrs, encode_state(st, scale, FMT, SR, rbits, BOUNDED), mask=mask)
        if FMT >= 2:
            tl.store(scale_ptrs, scale, mask=mask_k)

    @triton.jit
    def token_row(rows, stride_t, t, mask, T):
        """Token ``t``'s inputs at ``rows + t * stride_t`` in float32 (``t`` capped at the last of the
        ``T`` tokens, so a load one past them stays in bounds). A verify kernel with prefetch loads token
        ``t + 1``'s while token ``t`` computes; without it, each token's loads cost a memory round trip in
        every K block."""
        return tl.load(rows + tl.minimum(t, T - 1) * stride_t, mask=mask, other=0.0).to(tl.float32)

    @triton.jit
    def token_tile(rows_ptrs, stride_t, rows, mask):
        """The inputs at ``rows_ptrs + t * stride_t`` of the tokens ``rows`` as a float32 tile, 0 where not ``mask``:
        :func:`token_row` for a whole chunk of tokens."""
        return tl.load(rows_ptrs[None, :] + rows[:, None] * stride_t, mask=mask, other=0.0).to(tl.float32)

    @triton.jit
    def verify_chunk_program(state_ptr, scale_ptr, idx_ptr, s_sp, s_sh, s_sk, s_cp, s_ch, T, H: tl.constexpr,
                             K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                             BLOCK_T: tl.constexpr, FMT: tl.constexpr):
        """What a one-chunk verify program (sequence ``b``, head ``h``, a V block) starts from: ``b``, ``h``, the K
        and V offsets and masks, the token rows and their mask, and its pool slot's stored state in float32."""
        pid = tl.program_id(0)
        b = pid // H
        h = pid % H
        slot = tl.load(idx_ptr + b).to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        rows = tl.arange(0, BLOCK_T)
        S0 = load_state_rows(state_ptr + slot * s_sp + h * s_sh + offs_k[:, None] * s_sk + offs_v[None, :],
                             scale_ptr + slot * s_cp + h * s_ch + offs_k, mask_k, mask_k[:, None] & mask_v[None, :],
                             FMT, BLOCK_K)[0]
        return b, h, offs_k, mask_k, offs_v, mask_v, rows, rows < T, S0

    @triton.jit
    def store_verified_state(st, old_scale, t, steps, position, seed, slot, h, offs_k, mask_k, mask_v, static_ptrs,
                             ptrs, sc_ptrs, kept_ptrs, kept_sc_ptrs, K: tl.constexpr, V: tl.constexpr,
                             BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, FMT: tl.constexpr, RENORM: tl.constexpr,
                             QMAX: tl.constexpr, SR: tl.constexpr, KEEP: tl.constexpr, COMMIT: tl.constexpr):
        """A verify kernel's store of token ``t``'s state tile ``st`` (rows ``offs_k`` of head ``h``), as
        decode step ``t`` would store it (store count ``position + t``): kept at ``kept_ptrs`` with
        ``KEEP``; written into the pool slot (``ptrs``) with ``COMMIT`` when ``t`` is the last of
        ``steps``. Returns the state as loaded back, and its row scales (the next token's)."""
        new_scale = old_scale
        if FMT >= 2:
            renorm_now = False
            if RENORM > 1:
                renorm_now = (position + t) % RENORM == 0
            new_scale = stored_row_scale(st, old_scale, static_ptrs, mask_k, renorm_now, RENORM, QMAX)
        rbits = 0
        if SR:
            rbits = state_random_bytes(seed, slot, position + t, 0, h, offs_k, 0, K, V, BLOCK_K, BLOCK_V)
        codes = encode_state(st, new_scale, FMT, SR, rbits, RENORM > 0)
        if KEEP:
            tl.store(kept_ptrs, codes, mask=mask_k[:, None] & mask_v[None, :])
            if FMT >= 2:
                tl.store(kept_sc_ptrs, new_scale, mask=mask_k)
        if COMMIT:
            last = mask_k & (offs_k * 0 + t == steps - 1)  # only the state after the last accepted token
            tl.store(ptrs, codes, mask=last[:, None] & mask_v[None, :])
            if FMT >= 2:
                tl.store(sc_ptrs, new_scale, mask=last)
        return decode_state(codes, new_scale, FMT), new_scale

    @triton.jit
    def intra_chunk_tile(cu_ptr, slot_ptr, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr):
        """What an intra-chunk kernel's program owns (grid and slot map:
        :func:`laquant.kernels.delta.intra.intra_grid`): value head ``h``, its sequence's end ``eos`` and batch
        row ``b``, the chunk's rows, K / V offsets and masks, and :func:`chunk_rows` of its chunk (``t0 >= eos``:
        a spare varlen slot, nothing to do)."""
        if VARLEN:
            n = tl.load(slot_ptr + 2 * tl.program_id(0))
            i_c = tl.load(slot_ptr + 2 * tl.program_id(0) + 1)
            h = tl.program_id(1)
        else:
            n = tl.program_id(1) // H
            i_c = tl.program_id(0)
            h = tl.program_id(1) % H
        bos, eos, b = sequence_span(cu_ptr, n, T, VARLEN)
        rows = tl.arange(0, BT)
        offs_k = tl.arange(0, BK)
        offs_v = tl.arange(0, BV)
        mk = offs_k < K
        mv = offs_v < V
        t0, offs_t, mt, mtk = chunk_rows(bos, eos, i_c, rows, mk, BT)
        return h, eos, b, rows, offs_k, offs_v, mk, mv, t0, offs_t, mt, mtk

    @triton.jit
    def program_tile(cu_ptr, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                     BV: tl.constexpr, VARLEN: tl.constexpr):
        """What a chunked kernel's program owns (grid: ``N * H`` by V blocks): sequence ``n``, head
        ``h``, V block ``i_v``, the sequence's span ``(bos, eos, batch row)`` and the K / V offsets
        and masks of its state tile."""
        i_nh = tl.program_id(0)
        i_v = tl.program_id(1)
        n = i_nh // H
        h = i_nh % H
        bos, eos, b = sequence_span(cu_ptr, n, T, VARLEN)
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mk = offs_k < K
        mv = offs_v < V
        return n, h, i_v, bos, eos, b, offs_k, offs_v, mk, mv, mk[:, None] & mv[None, :]

    @triton.jit
    def chunk_rows(bos, eos, i_c, rows, mk, BT: tl.constexpr):
        """Chunk ``i_c`` of the sequence ``[bos, eos)``: its first token, its token offsets, and their
        mask alone and with the K mask."""
        t0 = bos + i_c * BT
        offs_t = t0 + rows
        mt = offs_t < eos
        return t0, offs_t, mt, mt[:, None] & mk[None, :]

    @triton.jit
    def start_state(h0_ptr, h0s_ptr, static_ptr, n, h, offs_k, offs_v, mk, mkv, H: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, HAS_H0: tl.constexpr, IN_FMT: tl.constexpr, RT_STATIC: tl.constexpr,
                    BK: tl.constexpr, BV: tl.constexpr):
        """Where a chunked kernel's program starts, for sequence ``n`` and head ``h``: the offsets of
        its tile in ``[N, H, K, V]`` states and ``[N, H, K]`` row scales, the initial state (zeros
        without ``HAS_H0``) and the round trip's static row scales (ones without ``RT_STATIC``)."""
        state_off = (n * H + h).to(tl.int64) * K * V + offs_k[:, None] * V + offs_v[None, :]
        scale_off = (n * H + h).to(tl.int64) * K + offs_k
        S = tl.zeros([BK, BV], dtype=tl.float32)
        if HAS_H0:
            S, _ = load_state_rows(h0_ptr + state_off, h0s_ptr + scale_off, mk, mkv, IN_FMT, BK)
        static = tl.full([BK], 1.0, tl.float32)
        if RT_STATIC:
            static = tl.load(static_ptr + h * K + offs_k, mask=mk, other=1.0)
        return S, static, state_off, scale_off

    @triton.jit
    def sequence_span(cu_ptr, n, T, VARLEN: tl.constexpr):
        """``(bos, eos, batch row)`` of sequence ``n``: packed along T by ``cu_seqlens`` (VARLEN), or
        row ``n`` of the batch."""
        if VARLEN:
            bos = tl.load(cu_ptr + n).to(tl.int64)
            eos = tl.load(cu_ptr + n + 1).to(tl.int64)
            b = 0
        else:
            bos = 0
            eos = T
            b = n
        return bos, eos, b
