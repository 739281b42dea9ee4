"""Triton kernels: int8 GEMMs with an LLM.int8-style outlier split, one output. Two paths:

**W8A8** (:func:`int8_outlier_linear_triton`), spec
:func:`laquant.kernels.gemm.reference.int8_outlier_linear` with per-token activations and
per-output-channel (or per-tensor) weight scales. Two launches:

1. ``_quantize_rows_kernel`` reads x once per row: the absmax over the non-outlier columns gives
   the token's scale, the kept columns are written as int8, packed (the weight's layout), and the
   outlier columns are gathered into a small dense ``[M, n_outliers]`` block (``n_outliers`` padded to
   :data:`OUTLIER_ALIGN`);
2. the GEMM multiplies int8 x int8 into int32 accumulators on the tensor cores, and its epilogue
   dequantizes with the row and column scales, adds the outlier block times the bf16 outlier
   weights (a second, thin tensor-core product) and the bias, and writes y once. At large M the
   tiled ``_int8_gemm_kernel`` (:func:`.configs.tiled_config`); at decode sizes (M <= 256) the split-K
   ``_splitk_gemm_kernel``, which cuts the weight stream along N (small BN) and K (``SPLIT_K``
   programs per output tile) so that enough programs stream the weight.

**W8A16**, weight-only (:func:`int8_weight_only_linear_triton`), spec ``int8_outlier_linear(...,
act_granularity="none")``: one launch of ``_splitk_gemm_kernel`` on x itself (bf16, fp16 or fp32):
the kept columns read through ``packed.source``, the int8 weight converted to x's dtype in registers
(exact), fp32 accumulation, the column scale in the epilogue, plus the outlier block (gathered from
x) times the outlier weights, plus the bias.

Split-K: each split's fp32 partial goes to a workspace; the last split of a tile to arrive (an
atomic counter per tile, left at zero again) sums the partials in split order and writes y, so the
result does not depend on the order in which the programs ran (bit-reproducible), in one launch.
(``FIXUP=False`` sums them in a second small kernel.) The counters: :mod:`..common.counters`.

**Dispatch and numerics contract** (:func:`linear_triton`, ``mode="auto"``): :func:`choose_gemm`
picks, per M bucket and layer shape, whichever path the committed sweep (``configs.TABLES``, one
table per GPU model it ran on, made by ``tools/sweep_gemm.py``) found faster on this GPU. W8A8
quantizes the activations per token, so a token's output does not depend on the other tokens in the
batch. Where the table picks W8A16 (small M, decode) the activations are *not* quantized: the result
is closer to the float model there, and a token's output differs from what W8A8 gives it. Since the
path depends on the batch's token count M, the same token gets (slightly) different outputs in a
decode step (small M: W8A16 where the table says so) and in a prefill (large M: W8A8). Both agree
with their spec to float rounding; ``mode="w8a8"`` or ``"w8a16"`` pins one path for all M (e.g. to
compare with the CPU reference, which follows the module's ``act_granularity``). The tables that
ship say which path runs where: see ``configs.TABLES`` and ``eval/results/gemm_decode_*.md``; since
each GPU model has its own, a token's decode output may also differ (by that rounding) between two
models of GPU.

**Per-group W8A8** (``act_granularity: per_group``, ``PackedOutlierWeight.group``): one activation scale per token
and group of 128 input columns; the int8 weight holds every input column in order (zero at the outlier columns), so
that its groups are the input's. :func:`quantize_groups` writes the codes and scales, and the same two GEMMs scale each
group's int32 sums by its scale into a float32 accumulator (spec: ``int8_outlier_linear(..., "per_group")``, which
sums the groups in order: the kernels agree with it to float rounding). Always this path, whatever M, on
:func:`.configs.group_config`'s tiles (a table of their own, ``GROUP_TABLES``).

The GEMMs read the module's own ``[N, n_keep]`` int8 weight (:class:`PackedOutlierWeight` holds no
copy of it), as plain row-major tiles. The activation quantization is not fused into the GEMM's main
loop (the per-token scale needs the whole row first; the ``FUSE_Q`` variant that does it measured
slower): it is a pass of its own (:func:`quantize_rows`), or, in the model path, the epilogue of the
kernel that made the input (:mod:`..rowwise.fused`), whose codes :func:`int8_gemm` takes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from ..common.counters import N_COUNTERS, arrival_counters
from ..common.gpus import device_name
from ..common.launch import launch_kernel
from ..common.pdl import pdl_launch
from ..common.sizes import cdiv, next_power_of_2
from .configs import choose_config, choose_gemm, group_config, tiled_config  # noqa: F401  (re-exported)

try:
    import triton
    import triton.language as tl

    from ..common.counters import last_to_arrive, reset_counter
    from ..common.pdl import pdl_release, pdl_wait
    from ..common.triton_numerics import (quantize_int8, row_absmax_scales, store_codes, store_token_codes,
                                          stored_int8_codes, token_code_map)
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


# The outlier block's row length, in columns: a multiple of 16 lets Triton vectorize the kernels' loads
# of the outlier activations and weights (rows of 270 bf16 made the 2048 x 5632 GEMM 3.8x slower at
# M = 1,024 than rows of 64; eval/results/gemm_outliers_h200/).
OUTLIER_ALIGN = 16


@dataclass
class PackedOutlierWeight:
    """What the kernels read of a QuantLinear: ``qweight`` ``[N, n_keep]`` int8, its rows padded
    with zeros to a multiple of 16 (the module's own buffer, not a copy: the outlier columns are
    already left out), ``scale`` ``[N]`` float32,
    ``source`` ``[n_keep padded]`` int32 (the input column each int8 column holds, -1 in the padding),
    ``outlier_idx`` ``[n_out]`` int32 and ``outlier_weight`` ``[N, n_out]`` (model dtype), ``n_out`` padded
    to a multiple of :data:`OUTLIER_ALIGN` (the last index again, with zero weights: the same sums; the
    outlier weight is then a padded copy of the module's). ``n_keep``: the kept columns; ``identity``:
    no outliers, the columns in order (a row's codes are then its columns as they come). ``dest``
    ``[in_features]`` int32: where each input column goes, its packed int8 column (>= 0) or ``-1 - slot``
    of the outlier block (the producers that scatter a token's codes from registers); ``n_out``: the
    outlier columns before the padding. ``group``: 0 for per-token activations; under per-group activations
    (``act_granularity: per_group``) the columns one activation scale covers, the int8 weight then holding every
    input column in order (``n_keep == in_features``, zero at the outlier columns)."""

    qweight: torch.Tensor
    scale: torch.Tensor
    source: torch.Tensor
    outlier_idx: torch.Tensor
    outlier_weight: torch.Tensor
    bias: torch.Tensor | None
    in_features: int
    n_keep: int
    identity: bool
    dest: torch.Tensor
    n_out: int
    group: int = 0
    # launch arguments derived from the fields above alone, computed at the first launch that needs them (the
    # eager paths are bound by the host's Python): kernel wrappers' own keys
    host: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def pack(cls, qweight, weight_scale, keep_idx, outlier_idx, outlier_weight, bias, in_features, group=0):
        N = qweight.shape[0]
        if qweight.stride(0) % 16 or qweight.stride(1) != 1:
            raise ValueError("the int8 GEMM needs weight rows contiguous and padded to a multiple of 16")
        n_keep, n_out = keep_idx.numel(), outlier_idx.numel()
        if group and n_keep != in_features:
            raise ValueError(f"a per-group weight keeps all {in_features} input columns in order, not {n_keep}")
        if not group and n_keep + n_out != in_features:
            raise ValueError(f"{n_keep} kept and {n_out} outlier columns do not make the layer's {in_features} inputs")
        source = torch.full((qweight.shape[1],), -1, dtype=torch.int32, device=qweight.device)
        source[:n_keep] = keep_idx.to(torch.int32)
        identity = n_out == 0 and torch.equal(keep_idx.cpu(), torch.arange(n_keep, dtype=keep_idx.dtype))
        dest = torch.empty(in_features, dtype=torch.int32, device=qweight.device)
        dest[keep_idx] = torch.arange(n_keep, dtype=torch.int32, device=qweight.device)
        dest[outlier_idx] = -1 - torch.arange(n_out, dtype=torch.int32, device=qweight.device)
        pad = -n_out % OUTLIER_ALIGN if n_out else 0
        if pad:
            outlier_idx = torch.cat([outlier_idx, outlier_idx[-1:].expand(pad)])
            outlier_weight = torch.nn.functional.pad(outlier_weight, (0, pad))
        return cls(qweight, weight_scale.reshape(-1).float().expand(N).contiguous(), source,
                   outlier_idx.to(torch.int32).contiguous(), outlier_weight.contiguous(), bias, in_features, n_keep,
                   identity, dest, n_out, group)


if triton is not None:

    @triton.jit
    def _quantize_rows_kernel(x_ptr, source_ptr, idx_ptr, xq_ptr, xs_ptr, xo_ptr, K, KQ, NO, NK, s_xm,
                              BK: tl.constexpr, BNO: tl.constexpr, HAS_OUT: tl.constexpr, ONE_TILE: tl.constexpr,
                              IDENTITY: tl.constexpr):
        # gathers the kept columns and stores the int8 row contiguously (vectorised stores; a scatter
        # to the compacted positions made this pass several times slower at large M * K)
        m = tl.program_id(0).to(tl.int64)
        row = x_ptr + m * s_xm
        out = xq_ptr + m * KQ
        if ONE_TILE and IDENTITY:  # every column kept, in order: a plain load (1.2-1.9x faster than the gather)
            offs = tl.arange(0, BK)
            store_codes(tl.load(row + offs, mask=offs < K, other=0.0).to(tl.float32), offs, offs < K, out,
                        xs_ptr + m, NK, KQ)
        elif ONE_TILE:  # the whole row in registers: x is read once
            src, idx = token_code_map(source_ptr, idx_ptr, KQ, NO, BK, BNO, HAS_OUT)
            store_token_codes(row, src, idx, out, xs_ptr + m, xo_ptr + m * NO, KQ, NO, BK, BNO, HAS_OUT)
        else:
            _quantize_long_row(row, source_ptr, out, xs_ptr + m, KQ, BK)
            if HAS_OUT:
                offs_o = tl.arange(0, BNO)
                mo = offs_o < NO
                idx = tl.load(idx_ptr + offs_o, mask=mo, other=0)
                tl.store(xo_ptr + m * NO + offs_o, tl.load(row + idx, mask=mo, other=0.0), mask=mo)

    @triton.jit
    def _quantize_long_row(row, source_ptr, out, scale_out, KQ, BK: tl.constexpr):
        amax = tl.zeros([BK], dtype=tl.float32)
        for k0 in range(0, KQ, BK):
            offs = k0 + tl.arange(0, BK)
            src = tl.load(source_ptr + offs, mask=offs < KQ, other=-1)
            amax = tl.maximum(amax, tl.abs(tl.load(row + src, mask=src >= 0, other=0.0).to(tl.float32)))
        scale = tl.maximum(tl.max(amax, axis=0) / 127.0, 1.1754943508222875e-38)
        tl.store(scale_out, scale)
        for k0 in range(0, KQ, BK):
            offs = k0 + tl.arange(0, BK)
            src = tl.load(source_ptr + offs, mask=offs < KQ, other=-1)
            x = tl.load(row + src, mask=src >= 0, other=0.0).to(tl.float32)
            tl.store(out + offs, stored_int8_codes(x, scale), mask=offs < KQ)

    @triton.jit
    def _quantize_groups_kernel(x_ptr, dest_ptr, idx_ptr, xq_ptr, xs_ptr, xo_ptr, M, K, KQ, NO, G, s_xm,
                                BR: tl.constexpr, GROUP: tl.constexpr, BNO: tl.constexpr, HAS_OUT: tl.constexpr):
        """Per-group W8A8 codes of ``BR`` tokens and one group of ``GROUP`` columns: the group's absmax over its
        kept columns (the outlier columns, ``dest < 0``, count as zeros) gives the scale ``xs[m, g]``; the codes
        go to the int8 weight's column positions (zeros in the padding up to ``KQ``), and the first group's
        programs gather the outlier block."""
        rows = tl.program_id(0) * BR + tl.arange(0, BR)
        g = tl.program_id(1)
        cols = g * GROUP + tl.arange(0, GROUP)
        rm = rows < M
        r64 = rows.to(tl.int64)
        kept = cols < K
        if HAS_OUT:
            kept = kept & (tl.load(dest_ptr + cols, mask=kept, other=-1) >= 0)
        x = tl.load(x_ptr + r64[:, None] * s_xm + cols[None, :], mask=rm[:, None] & kept[None, :],
                    other=0.0).to(tl.float32)
        scale = row_absmax_scales(x)
        tl.store(xs_ptr + r64 * G + g, scale, mask=rm)
        tl.store(xq_ptr + r64[:, None] * KQ + cols[None, :], stored_int8_codes(x, scale[:, None]),
                 mask=rm[:, None] & (cols < KQ)[None, :])
        if HAS_OUT:
            if g == 0:
                offs_o = tl.arange(0, BNO)
                mo = rm[:, None] & (offs_o < NO)[None, :]
                idx = tl.load(idx_ptr + offs_o, mask=offs_o < NO, other=0)
                tl.store(xo_ptr + r64[:, None] * NO + offs_o[None, :],
                         tl.load(x_ptr + r64[:, None] * s_xm + idx[None, :], mask=mo, other=0.0), mask=mo)

    @triton.jit
    def _add_outliers(y, xo, wo_ptr, offs_n, mn, offs_o, mo, NO):
        """``y`` plus the outlier columns' thin product ``xo [BM, BNO] @ outlier_weight[offs_n, offs_o]^T``
        (in the model dtype on the tensor cores; exact float32 products for float32 x)."""
        return _add_outlier_product(y, xo, _outlier_weight_tile(wo_ptr, offs_n, mn, offs_o, mo, NO))

    @triton.jit
    def _outlier_weight_tile(wo_ptr, offs_n, mn, offs_o, mo, NO):
        """``outlier_weight[offs_n, offs_o]^T``, ``[BNO, BN]`` (0 outside the masks)."""
        return tl.load(wo_ptr + offs_n[None, :].to(tl.int64) * NO + offs_o[:, None], mask=mo[:, None] & mn[None, :],
                       other=0.0)

    @triton.jit
    def _add_outlier_product(y, xo, wo):
        if xo.dtype == tl.float32:
            return y + tl.dot(xo, wo.to(tl.float32), input_precision="ieee")
        return y + tl.dot(xo, wo.to(xo.dtype))

    @triton.jit
    def _int8_gemm_kernel(a_ptr, w_ptr, xs_ptr, ws_ptr, xo_ptr, wo_ptr, bias_ptr, y_ptr, M, N, K, NO, s_ym,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BNO: tl.constexpr,
                          GROUP_M: tl.constexpr, HAS_OUT: tl.constexpr, HAS_BIAS: tl.constexpr,
                          GROUP: tl.constexpr = 0):
        # GROUP: per-group activation scales xs [M, cdiv(K, GROUP)], applied to each BK step's int32 sums (BK
        # divides GROUP), the sums over the groups in float32
        pid = tl.program_id(0)
        n_m = tl.cdiv(M, BM)
        n_n = tl.cdiv(N, BN)
        # grouped order: GROUP_M row blocks share the weight tiles while they sit in L2
        group = pid // (GROUP_M * n_n)
        first_m = group * GROUP_M
        size_m = tl.minimum(n_m - first_m, GROUP_M)
        pid_m = first_m + (pid % (GROUP_M * n_n)) % size_m
        pid_n = (pid % (GROUP_M * n_n)) // size_m
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        mm = offs_m < M
        mn = offs_n < N
        a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * K + offs_k[None, :]
        w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]
        acc = tl.zeros([BM, BN], dtype=tl.float32 if GROUP else tl.int32)
        for k0 in range(0, K, BK):
            mk = (k0 + offs_k) < K
            a = tl.load(a_ptrs, mask=mm[:, None] & mk[None, :], other=0)
            w = tl.load(w_ptrs, mask=mk[:, None] & mn[None, :], other=0)
            if GROUP:
                gs = tl.load(xs_ptr + offs_m.to(tl.int64) * tl.cdiv(K, GROUP) + k0 // GROUP, mask=mm, other=0.0)
                acc += tl.dot(a, w, out_dtype=tl.int32).to(tl.float32) * gs[:, None]
            else:
                acc = tl.dot(a, w, acc, out_dtype=tl.int32)
            a_ptrs += BK
            w_ptrs += BK
        ws = tl.load(ws_ptr + offs_n, mask=mn, other=0.0)
        if GROUP:
            y = acc * ws[None, :]
        else:
            xs = tl.load(xs_ptr + offs_m, mask=mm, other=0.0)
            y = acc.to(tl.float32) * xs[:, None] * ws[None, :]
        if HAS_OUT:
            for o0 in range(0, NO, BNO):
                offs_o = o0 + tl.arange(0, BNO)
                mo = offs_o < NO
                xo = tl.load(xo_ptr + offs_m[:, None].to(tl.int64) * NO + offs_o[None, :],
                             mask=mm[:, None] & mo[None, :], other=0.0)
                y = _add_outliers(y, xo, wo_ptr, offs_n, mn, offs_o, mo, NO)
        if HAS_BIAS:
            y += tl.load(bias_ptr + offs_n, mask=mn, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None].to(tl.int64) * s_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=mm[:, None] & mn[None, :])


    @triton.jit(do_not_specialize=["M", "SPLIT_K"])
    def _splitk_gemm_kernel(a_ptr, src_ptr, w_ptr, xs_ptr, ws_ptr, xo_ptr, oidx_ptr, wo_ptr, bias_ptr, y_ptr,
                            part_ptr, cnt_ptr, M, N, K, KX, NO, SPLIT_K, s_am, s_ym,
                            A8: tl.constexpr, FUSEQ: tl.constexpr, GATHER: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                            BK: tl.constexpr, BNO: tl.constexpr, SPLIT: tl.constexpr, FIXUP: tl.constexpr,
                            HAS_OUT: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr,
                            PDL: tl.constexpr, ONE_OUT: tl.constexpr = False, GROUP: tl.constexpr = 0):
        """Small-M GEMM over the ``[N, K]`` int8 weight: few rows, so the weight stream is cut along N
        (small BN) and along K (``SPLIT_K`` programs per output tile, fp32 partials).

        ``A8``: a is the int8 ``[M, K]`` codes of quantize_rows (int32 dot, row x column scales);
        else a is x itself (bf16/fp16/fp32), its kept columns read through ``src`` when ``GATHER``
        (columns in order when not), the int8 weight converted in registers, fp32 dot, column scale.
        ``A8`` and ``FUSEQ``: a is x, quantized per token inside the kernel (each program reads its
        rows' kept columns once for the absmax, then quantizes its K slice as it goes: one launch,
        the same codes as quantize_rows; for small M, where x is small).
        ``GROUP`` (``A8`` codes only, not with ``FUSEQ`` or ``SWAP_AB``): per-group activation scales
        ``xs [M, cdiv(K, GROUP)]``, each group's int32 sums scaled by its scale into a float32 accumulator
        (:func:`_group_scaled_products`); the epilogue then applies the column scale alone.
        ``SWAP_AB`` (``A8`` codes only): the product runs as ``w [BN, BK] @ a^T [BK, BM]``, so the
        weight rows fill the tensor cores' tall side (64 on Hopper's wgmma) and the few tokens the
        narrow one; the accumulator is transposed back before the epilogue (same int32 sums).
        Split 0 adds the outlier product and the bias to its partial. ``FIXUP``: each split stores
        its partial, counts itself on the tile's counter, and the last to arrive sums the partials in
        split order (deterministic) and writes y, then zeroes the counter (one launch); otherwise
        :func:`_splitk_reduce_kernel` sums them. ``PDL``: see :mod:`..common.pdl`.

        The epilogue's operands are loaded before the main loop, the parameters (column scales, bias and, with
        ``ONE_OUT``, i.e. at most ``BNO`` outlier columns, the outlier weights) even before the PDL wait: a decode
        step's other weights have evicted them from L2, and loaded after the loop their device-memory latency
        followed the last product."""
        pid_m = tl.program_id(0)  # the row blocks of one weight tile run side by side: it streams once
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        mm = offs_m < M
        mn = offs_n < N
        k_per = tl.cdiv(tl.cdiv(K, BK), SPLIT_K) * BK
        k_lo = pid_k * k_per
        k_hi = tl.minimum(K, k_lo + k_per)
        ws = tl.load(ws_ptr + offs_n, mask=mn, other=0.0)
        if HAS_BIAS:  # split 0 adds the bias and the outlier product
            bias = tl.load(bias_ptr + offs_n, mask=offs_n < tl.where(pid_k == 0, N, 0), other=0.0).to(tl.float32)
        if ONE_OUT:
            offs_o1 = tl.arange(0, BNO)
            mo1 = offs_o1 < tl.where(pid_k == 0, NO, 0)
            wo1 = _outlier_weight_tile(wo_ptr, offs_n, mn, offs_o1, mo1, NO)
        pdl_wait(PDL)
        a_rows = a_ptr + offs_m[:, None].to(tl.int64) * s_am
        if ONE_OUT:
            if A8 and not FUSEQ:  # quantize_rows' (or the producer's) dense outlier block
                xo1 = tl.load(xo_ptr + offs_m[:, None].to(tl.int64) * NO + offs_o1[None, :],
                              mask=mm[:, None] & mo1[None, :], other=0.0)
            else:  # gathered from x
                oi1 = tl.load(oidx_ptr + offs_o1, mask=mo1, other=0)
                xo1 = tl.load(a_rows + oi1[None, :], mask=mm[:, None] & mo1[None, :], other=0.0)
        w_cols = w_ptr + offs_n[None, :].to(tl.int64) * K
        if SWAP_AB:
            acc_t = tl.zeros([BN, BM], dtype=tl.int32)
            xs = tl.load(xs_ptr + offs_m, mask=mm, other=0.0)
            w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K
            a_cols = a_ptr + offs_m[None, :].to(tl.int64) * s_am
            for k0 in range(k_lo, k_hi, BK):
                kk = k0 + offs_k
                if EVEN_K:
                    w = tl.load(w_rows + kk[None, :], mask=mn[:, None], other=0)
                    a = tl.load(a_cols + kk[:, None], mask=mm[None, :], other=0)
                else:
                    mk = kk < k_hi
                    w = tl.load(w_rows + kk[None, :], mask=mn[:, None] & mk[None, :], other=0)
                    a = tl.load(a_cols + kk[:, None], mask=mk[:, None] & mm[None, :], other=0)
                acc_t = tl.dot(w, a, acc_t, out_dtype=tl.int32)
            acc = tl.trans(acc_t)
        elif A8 and GROUP:
            acc = _group_scaled_products(a_rows, w_cols, xs_ptr + offs_m.to(tl.int64) * tl.cdiv(K, GROUP), mm, mn,
                                         k_lo, k_hi, BM, BN, BK, GROUP, EVEN_K)
        else:
            if A8:
                acc = tl.zeros([BM, BN], dtype=tl.int32)
                if FUSEQ:  # the rows' absmax over all kept columns first (x from L2; small M only)
                    amax = tl.zeros([BM, BK], dtype=tl.float32)
                    for k0 in range(0, K, BK):
                        kk = k0 + offs_k
                        xa = _load_x(a_rows, src_ptr, kk, kk < K, mm, KX, GATHER)
                        amax = tl.maximum(amax, tl.abs(xa.to(tl.float32)))
                    xs = tl.maximum(tl.max(amax, axis=1) / 127.0, 1.1754943508222875e-38)
                else:
                    xs = tl.load(xs_ptr + offs_m, mask=mm, other=0.0)
            else:
                acc = tl.zeros([BM, BN], dtype=tl.float32)
            for k0 in range(k_lo, k_hi, BK):
                kk = k0 + offs_k
                if EVEN_K:  # no mask along the contiguous dimension: the loads vectorise
                    mk = offs_k < BK
                    w = tl.load(w_cols + kk[:, None], mask=mn[None, :], other=0)
                else:
                    mk = kk < k_hi
                    w = tl.load(w_cols + kk[:, None], mask=mk[:, None] & mn[None, :], other=0)
                if A8:
                    if FUSEQ:
                        xa = _load_x(a_rows, src_ptr, kk, mk, mm, KX, GATHER).to(tl.float32)
                        a = quantize_int8(xa, xs[:, None])
                    elif EVEN_K:
                        a = tl.load(a_rows + kk[None, :], mask=mm[:, None], other=0)
                    else:
                        a = tl.load(a_rows + kk[None, :], mask=mm[:, None] & mk[None, :], other=0)
                    acc = tl.dot(a, w, acc, out_dtype=tl.int32)
                else:
                    a = _load_x(a_rows, src_ptr, kk, mk, mm, KX, GATHER)
                    if a.dtype == tl.float32:
                        acc = tl.dot(a, w.to(tl.float32), acc, input_precision="ieee")
                    else:
                        acc = tl.dot(a, w.to(a.dtype), acc)
        pdl_release(PDL)  # the next kernel's programs start during this epilogue
        if A8 and not GROUP:
            y = acc.to(tl.float32) * xs[:, None] * ws[None, :]
        else:
            y = acc * ws[None, :]
        if ONE_OUT:
            y = _add_outlier_product(y, xo1, wo1)  # zeros outside split 0
        if HAS_BIAS:
            y += bias[None, :]  # zeros outside split 0
        if pid_k == 0 and not ONE_OUT:
            if HAS_OUT:
                for o0 in range(0, NO, BNO):
                    offs_o = o0 + tl.arange(0, BNO)
                    mo = offs_o < NO
                    if A8 and not FUSEQ:  # quantize_rows' dense outlier block
                        xo = tl.load(xo_ptr + offs_m[:, None].to(tl.int64) * NO + offs_o[None, :],
                                     mask=mm[:, None] & mo[None, :], other=0.0)
                    else:  # gathered from x
                        oi = tl.load(oidx_ptr + offs_o, mask=mo, other=0)
                        xo = tl.load(a_rows + oi[None, :], mask=mm[:, None] & mo[None, :], other=0.0)
                    y = _add_outliers(y, xo, wo_ptr, offs_n, mn, offs_o, mo, NO)
        out_mask = mm[:, None] & mn[None, :]
        if SPLIT:
            mn_off = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
            MN = M.to(tl.int64) * N
            tl.store(part_ptr + pid_k * MN + mn_off, y, mask=out_mask)
            if FIXUP:
                tile = pid_n * tl.num_programs(0) + pid_m
                if last_to_arrive(cnt_ptr, tile, SPLIT_K):
                    tot = _summed_partials(part_ptr, MN, mn_off, out_mask, SPLIT_K, BM, BN)
                    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * s_ym + offs_n[None, :],
                             tot.to(y_ptr.dtype.element_ty), mask=out_mask)
                    reset_counter(cnt_ptr, tile)
        else:
            tl.store(y_ptr + offs_m[:, None].to(tl.int64) * s_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty),
                     mask=out_mask)

    @triton.jit
    def _summed_partials(part_ptr, MN, off, mask, SPLIT_K, BM: tl.constexpr, BN: tl.constexpr):
        """The ``[BM, BN]`` float32 partials at ``off`` of the ``SPLIT_K`` splits (``MN`` apart), summed in split order
        (deterministic) by the last split to arrive (:func:`..common.counters.last_to_arrive`), read past L1 (the
        other splits wrote them)."""
        tot = tl.zeros([BM, BN], dtype=tl.float32)
        for s in range(0, SPLIT_K):
            tot += tl.load(part_ptr + s * MN + off, mask=mask, other=0.0, cache_modifier=".cg")
        return tot

    @triton.jit
    def _group_scaled_products(a_rows, w_cols, g_rows, mm, mn, k_lo, k_hi, BM: tl.constexpr, BN: tl.constexpr,
                               BK: tl.constexpr, GROUP: tl.constexpr, EVEN_K: tl.constexpr):
        """``sum over the groups in [k_lo, k_hi) of (codes . weight)_int32 * the group's scale``, ``[BM, BN]``
        float32: a K step of BK columns is walked as sub-steps of one group each (BK a multiple of GROUP, or a
        group several steps of BK), each sub-step's exact int32 sums scaled by its row's scale of that group
        (``g_rows``: each row's scales)."""
        GK: tl.constexpr = BK if BK < GROUP else GROUP
        offs = tl.arange(0, GK)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            for j in tl.static_range(BK // GK):
                kj = k0 + j * GK
                kk = kj + offs
                if EVEN_K:  # no mask along the contiguous dimension: the loads vectorise
                    w = tl.load(w_cols + kk[:, None], mask=mn[None, :], other=0)
                    a = tl.load(a_rows + kk[None, :], mask=mm[:, None], other=0)
                else:
                    mk = kk < k_hi
                    w = tl.load(w_cols + kk[:, None], mask=mk[:, None] & mn[None, :], other=0)
                    a = tl.load(a_rows + kk[None, :], mask=mm[:, None] & mk[None, :], other=0)
                # past k_hi (an uneven K's last step) the products are zeros: any group's scale in bounds will do
                gs = tl.load(g_rows + tl.minimum(kj, k_hi - 1) // GROUP, mask=mm, other=0.0)
                acc += tl.dot(a, w, out_dtype=tl.int32).to(tl.float32) * gs[:, None]
        return acc

    @triton.jit
    def _load_x(a_rows, src_ptr, kk, mk, mm, KX, GATHER: tl.constexpr):
        """x's kept columns ``kk`` of the packed layout, ``[BM, BK]`` in x's dtype (0 outside)."""
        if GATHER:
            src = tl.load(src_ptr + kk, mask=mk, other=-1)
            return tl.load(a_rows + src[None, :], mask=mm[:, None] & (src >= 0)[None, :], other=0.0)
        # no outliers: the kept columns are x's first KX (the packed width pads them to 16)
        return tl.load(a_rows + kk[None, :], mask=mm[:, None] & (mk & (kk < KX))[None, :], other=0.0)

    @triton.jit(do_not_specialize=["SPLIT_K"])
    def _splitk_reduce_kernel(part_ptr, y_ptr, MN, SPLIT_K, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < MN
        tot = tl.zeros([BLOCK], dtype=tl.float32)
        for s in range(0, SPLIT_K):
            tot += tl.load(part_ptr + s * MN + offs, mask=m, other=0.0)
        tl.store(y_ptr + offs, tot.to(y_ptr.dtype.element_ty), mask=m)


def quantize_rows(x2: torch.Tensor, packed: PackedOutlierWeight):
    """Per-token int8 codes of the kept columns ``[M, n_keep]``, scales ``[M]`` and the outlier
    block ``[M, n_out]`` of x."""
    M, K = x2.shape
    NO = packed.outlier_idx.numel()
    KQ = packed.qweight.shape[1]
    xq = torch.empty(M, KQ, dtype=torch.int8, device=x2.device)  # padding columns get zeros
    xs = torch.empty(M, dtype=torch.float32, device=x2.device)
    xo = torch.empty(M, max(NO, 1), dtype=x2.dtype, device=x2.device)
    if M:
        one_tile = KQ <= 16384  # the row in registers of one program (16 warps above 8192)
        launch_kernel(_quantize_rows_kernel, (M,),
            x2, packed.source, packed.outlier_idx, xq, xs, xo, K, KQ, NO, packed.n_keep,
            x2.stride(0), BK=next_power_of_2(KQ) if one_tile else 2048,
            BNO=max(16, next_power_of_2(NO)), HAS_OUT=NO > 0, ONE_TILE=one_tile,
            IDENTITY=packed.identity,  # K <= KQ: the row fits the tile
            num_warps=4 if K <= 2048 else 8 if KQ <= 8192 or not one_tile else 16)
    return xq, xs, xo


def int8_outlier_linear_triton(x: torch.Tensor, packed: PackedOutlierWeight, config: dict | None = None) -> torch.Tensor:
    """``x [..., K]`` -> ``y [..., N]`` in x's dtype; the Triton twin of ``int8_outlier_linear``
    (per-token activations, W8A8; per-group ones for a per-group ``packed``, their codes in a pass of their own).
    ``config``: tiles of the split-K kernel (a dict with ``SPLIT_K``) or of the tiled kernel (``GROUP_M``); None
    takes the committed table's (:mod:`.configs`)."""
    x2, shape, M, N, K = _prepare(x, packed)
    cfg = config
    if cfg is None:
        tiles = group_config if packed.group else functools.partial(choose_config, "w8a8")
        cfg = tiles(M, N, K, device_name(x.device))
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if packed.group:  # per-group activations (act_granularity per_group): their own pass, then the GEMM
        int8_gemm(*quantize_groups(x2, packed), packed, y, cfg)
        return y.reshape(*shape[:-1], N)
    if M and cfg.get("FUSE_Q"):  # one launch: the per-token quantization inside the GEMM
        _launch_splitk(True, x2, x2.stride(0), None, None, packed, y, cfg, fuse_q=True)
        return y.reshape(*shape[:-1], N)
    int8_gemm(*quantize_rows(x2, packed), packed, y, cfg)
    return y.reshape(*shape[:-1], N)


def int8_gemm(xq: torch.Tensor, xs: torch.Tensor, xo: torch.Tensor, packed: PackedOutlierWeight, y: torch.Tensor,
              cfg: dict) -> None:
    """The W8A8 GEMM on activations already quantized (:func:`quantize_rows`, or a kernel that
    wrote the same codes, scales and outlier block as its epilogue; :func:`quantize_groups` for a per-group
    ``packed``), into ``y [M, N]``."""
    M, N = y.shape
    if M and "SPLIT_K" in cfg:
        _launch_splitk(True, xq, xq.stride(0), xs, xo, packed, y, cfg)
    elif M:
        cfg = dict(cfg)
        if packed.group:
            cfg["BK"] = min(cfg["BK"], packed.group)
        cfg["BK"], cfg["num_stages"] = _fit_smem(cfg, 1, _tile_smem(y.device))
        warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
        KQ, NO = packed.qweight.shape[1], packed.outlier_idx.numel()
        grid = (cdiv(M, cfg["BM"]) * cdiv(N, cfg["BN"]),)
        launch_kernel(_int8_gemm_kernel, grid, xq, packed.qweight, xs, packed.scale, xo, packed.outlier_weight,
                      packed.bias if packed.bias is not None else xs, y, M, N, KQ, NO, y.stride(0),
                      BNO=_bno(NO, y.dtype), HAS_OUT=NO > 0,
                      HAS_BIAS=packed.bias is not None, GROUP=packed.group, num_warps=warps, num_stages=stages,
                      **cfg)


def quantize_groups(x2: torch.Tensor, packed: PackedOutlierWeight):
    """Per-group int8 codes of x ``[M, KQ]`` (every input column in order, the outlier columns and the padding
    zero), scales ``[M, cdiv(KQ, packed.group)]`` and the outlier block ``[M, n_out]``, for a per-group
    ``packed`` (:func:`~laquant.kernels.common.numerics.quantize_int8_groups` is the spec)."""
    if not packed.group:
        raise ValueError("quantize_groups is for a per-group weight (packed.group > 0); "
                         "quantize_rows quantizes per token")
    M, K = x2.shape
    NO, KQ, G = packed.outlier_idx.numel(), packed.qweight.shape[1], cdiv(packed.qweight.shape[1], packed.group)
    xq = torch.empty(M, KQ, dtype=torch.int8, device=x2.device)
    xs = torch.empty(M, G, dtype=torch.float32, device=x2.device)
    xo = torch.empty(M, max(NO, 1), dtype=x2.dtype, device=x2.device)
    if M:
        BR = 16
        launch_kernel(_quantize_groups_kernel, (cdiv(M, BR), G), x2, packed.dest, packed.outlier_idx, xq, xs, xo,
                      M, K, KQ, NO, G, x2.stride(0), BR=BR, GROUP=packed.group, BNO=max(16, next_power_of_2(NO)),
                      HAS_OUT=NO > 0, num_warps=4)
    return xq, xs, xo


def int8_weight_only_linear_triton(x: torch.Tensor, packed: PackedOutlierWeight, config: dict | None = None) -> torch.Tensor:
    """W8A16: ``x [..., K]`` (bf16, fp16 or fp32) -> ``y [..., N]`` in x's dtype; the Triton twin of
    ``int8_outlier_linear(..., act_granularity="none")``. One launch: x's kept columns are read
    through ``packed.source`` inside the GEMM (no quantization pass), the int8 weight becomes x's
    dtype in registers, fp32 accumulation, the column scale in the epilogue, plus the outlier block
    product and the bias. ``config``: split-K tiles (a dict with ``SPLIT_K``); None takes the table's."""
    x2, shape, M, N, K = _prepare(x, packed)
    if x2.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"the weight-only GEMM takes bf16, fp16 or fp32 x, not {x2.dtype}")
    cfg = config if config is not None else choose_config("w8a16", M, N, K, device_name(x.device))
    if "SPLIT_K" not in cfg:
        raise ValueError("the weight-only GEMM runs the split-K kernel: its config needs SPLIT_K")
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M:
        _launch_splitk(False, x2, x2.stride(0), None, None, packed, y, cfg)
    return y.reshape(*shape[:-1], N)


def linear_triton(x: torch.Tensor, packed: PackedOutlierWeight, mode: str = "auto") -> torch.Tensor:
    """The quantized linear on the GPU: ``mode`` ``"w8a8"`` (per-token int8 activations),
    ``"w8a16"`` (weight-only) or ``"auto"``: whichever the committed sweep found faster at this
    number of tokens M = x.numel() / K (:func:`choose_gemm`); see the module docstring for what
    that means for the numerics. A per-group weight (``packed.group``) runs per-group W8A8 under ``"auto"`` and
    ``"w8a8"``, on :func:`.configs.group_config`'s tiles."""
    M, K = x.numel() // max(x.shape[-1], 1), x.shape[-1]
    N = packed.qweight.shape[0]
    device = device_name(x.device)
    if mode not in ("auto", "w8a8", "w8a16"):
        raise ValueError(f"mode must be auto, w8a8 or w8a16; got {mode!r}")
    if packed.group and mode != "w8a16":  # per-group activations: their own tiles (configs.group_config)
        path, cfg = "w8a8", group_config(M, N, K, device)
    elif mode == "auto":
        path, cfg = choose_gemm(M, N, K, device)
    else:
        path, cfg = mode, choose_config(mode, M, N, K, device)
    if path == "w8a16":
        return int8_weight_only_linear_triton(x, packed, cfg)
    return int8_outlier_linear_triton(x, packed, cfg)


def _prepare(x, packed):
    if triton is None:
        raise RuntimeError("Triton is not installed; use int8_outlier_linear")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, K = x2.shape
    if packed.in_features != K:
        raise ValueError(f"input has {K} features, the layer {packed.in_features}")
    return x2, shape, M, packed.qweight.shape[0], K


def _bno(NO, dtype):
    return min(64 if dtype != torch.float32 else 32, max(16, next_power_of_2(NO)))


HOPPER_TILE_SMEM = 224 * 1024  # what an H100's / H200's block may take (227 KiB) less what Triton keeps for itself


def tile_smem_budget(max_shared_mem: int) -> int:
    """Bytes of shared memory the GEMMs' pipelined tiles may take, from a block's opt-in maximum (Triton's
    ``max_shared_mem``): the same 3 KiB kept back as on the H100 / H200, where the tables were swept (224 KiB;
    an A100 160, an L40S or RTX 4090 96). :func:`_fit_smem` counts ``num_stages`` buffers, as Triton's Hopper
    pipeline holds them (compiled: the 64 x 128 x 256 tile of 4 stages takes 198 KiB on sm_90); before sm_90 it holds
    one fewer (144 KiB on sm_80 / sm_89), so the fit is conservative there. Unfitted, 13 of the H100 table's tiles
    would not launch on Ada (``eval/results/session20_h100/smem_fit_offline/``)."""
    return max_shared_mem - (227 * 1024 - HOPPER_TILE_SMEM)


@functools.lru_cache(maxsize=None)
def _tile_smem(device: torch.device) -> int:
    if device.type != "cuda" or triton is None:
        return HOPPER_TILE_SMEM
    index = device.index if device.index is not None else torch.cuda.current_device()
    return tile_smem_budget(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])


def _fit_smem(cfg, a_bytes, limit):
    """Shrink num_stages, then BK, until the pipelined a and w tiles fit in ``limit`` bytes of shared memory
    (:func:`tile_smem_budget`; fp32 x needs four times the int8 tile: the tables' tiles were swept with bf16 x)."""
    BK, stages = cfg["BK"], cfg["num_stages"]
    limit = limit if a_bytes < 4 else limit - 64 * 1024  # fp32 x: room for the fp32 copy of the w tile
    while stages * BK * (cfg["BM"] * a_bytes + cfg["BN"]) > limit:
        if stages > 2:
            stages -= 1
        elif BK > 32:
            BK //= 2
        else:
            break
    return BK, stages


def _launch_splitk(a8: bool, a, s_am, xs, xo, packed, y, cfg, fuse_q=False):
    M, N = y.shape
    KQ, NO = packed.qweight.shape[1], packed.outlier_idx.numel()
    BM, BN = cfg["BM"], cfg["BN"]
    BK, stages = _fit_smem(cfg, 1 if a8 and not fuse_q else a.element_size(), _tile_smem(y.device))
    group = packed.group if a8 else 0  # the weight-only path reads x itself: the layout alone differs
    if group and fuse_q:
        raise ValueError("a per-group weight's activations are quantized by quantize_groups, not in the GEMM")
    if group and BK % group and group % BK:
        raise ValueError(f"a per-group GEMM's K step ({BK}) must be a multiple or a divisor of its group ({group})")
    n_m, n_n = cdiv(M, BM), cdiv(N, BN)
    split = max(1, min(int(cfg["SPLIT_K"]), cdiv(KQ, BK)))
    fixup = bool(cfg.get("FIXUP", True)) and n_m * n_n <= N_COUNTERS
    bno = _bno(NO, y.dtype)
    part = torch.empty((split, M, N), dtype=torch.float32, device=y.device) if split > 1 else y
    cnt = arrival_counters(y.device) if split > 1 and fixup else packed.source
    dummy = packed.scale
    launch_kernel(_splitk_gemm_kernel, (n_m, n_n, split),
        a, packed.source, packed.qweight, dummy if xs is None else xs, packed.scale, dummy if xo is None else xo,
        packed.outlier_idx, packed.outlier_weight, packed.bias if packed.bias is not None else dummy, y,
        part, cnt, M, N, KQ, packed.in_features, NO, split, s_am, y.stride(0),
        A8=a8, FUSEQ=fuse_q, GATHER=NO > 0, BM=BM, BN=BN, BK=BK, BNO=bno, SPLIT=split > 1, FIXUP=fixup,
        HAS_OUT=NO > 0, HAS_BIAS=packed.bias is not None, EVEN_K=KQ % BK == 0,
        SWAP_AB=bool(cfg.get("SWAP_AB")) and a8 and not fuse_q and not group, num_warps=cfg["num_warps"],
        num_stages=stages, ONE_OUT=0 < NO <= bno, GROUP=group, **pdl_launch(y.device, M))
    if split > 1 and not fixup:
        launch_kernel(_splitk_reduce_kernel, (cdiv(M * N, 1024),), part, y, M * N, split, BLOCK=1024, num_warps=4)
