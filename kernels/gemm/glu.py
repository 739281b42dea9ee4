"""Triton kernel: a per-group MLP's gate/up GEMM that writes down's per-group codes itself, at decode sizes.

A per-group W8A8 MLP (``act_granularity: per_group``) runs gate and up as one split-K GEMM over their stacked weight
(``[gate; up]``, :mod:`laquant.quant.fused`), then ``_glu_group_kernel`` (``kernels/rowwise/fused.py``) reads both
halves back, applies ``act(gate) * up`` and writes down's codes, one scale per token and 128 input columns. A group's
codes need only that group's columns, so the GEMM can write them in its split-K fixup when one output tile holds a
whole group: here a tile is ``BN`` columns of the activation (``BN`` = down's group), i.e. gate rows ``n0 ..`` and up
rows ``NA + n0 ..`` of the stacked weight, two accumulators. The last split to arrive sums the partials in split
order, rounds gate and up to the output dtype as the GEMM stores them, applies the activation as the GLU kernel
does, and stores the activation and down's codes, scales and outlier values: the values the two launches give, bit
for bit, on the same tiles (the tests compare them; the GEMM's own table may take another tile shape, which can sum
the outlier columns' product in another order, an ulp apart). One launch instead of two, and the gate/up output is
never written.

Opt-in (``LAQUANT_GLU_FIXUP=1``, :func:`laquant.quant.fused.glu_fixup`) until it is timed on a GPU against the two
launches.
"""

from __future__ import annotations

import torch

from ..common.counters import N_COUNTERS, arrival_counters
from ..common.launch import launch_kernel
from ..common.pdl import pdl_launch
from ..common.sizes import cdiv, next_power_of_2, sm_count
from .configs import m_bucket
from .int8 import _bno

try:
    import triton
    import triton.language as tl

    from ..common.pdl import pdl_release, pdl_wait
    from ..common.triton_numerics import rounded, row_absmax_scales, stored_int8_codes
    from ..common.counters import last_to_arrive, reset_counter
    from .int8 import _add_outlier_product, _group_scaled_products, _outlier_weight_tile
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

def glu_fixup_fits(packed, down, M: int) -> bool:
    """Whether :func:`glu_codes_triton` takes gate/up's stacked per-group weight ``packed`` feeding ``down``'s per-group
    GEMM for ``M`` tokens: the split-K GEMM's sizes (:func:`.configs.m_bucket`; above them the GEMM runs tiled and the
    GLU kernel after it), an even stack without bias, down reading every activation column in order."""
    NA = packed.qweight.shape[0] // 2
    return (triton is not None and M > 0 and m_bucket(M) is not None and bool(packed.group) and bool(down.group)
            and packed.qweight.shape[0] == 2 * NA and packed.bias is None and down.in_features == NA
            and down.qweight.shape[1] >= NA and next_power_of_2(down.group) == down.group
            and packed.group % 16 == 0)


if triton is not None:

    @triton.jit(do_not_specialize=["M", "SPLIT_K"])
    def _splitk_glu_kernel(a_ptr, w_ptr, xs_ptr, ws_ptr, xo_ptr, wo_ptr, h_ptr, part_ptr, cnt_ptr, dest_ptr,
                           cq_ptr, cs_ptr, co_ptr, M, NA, KQ, NO, SPLIT_K, KQD, NOD, n_out_d,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BNO: tl.constexpr,
                           GROUP: tl.constexpr, SPLIT: tl.constexpr, HAS_OUT: tl.constexpr, ONE_OUT: tl.constexpr,
                           EVEN_K: tl.constexpr, SIGMOID: tl.constexpr, PDL: tl.constexpr):
        """Tile ``(pid_m, pid_n)``'s split ``pid_k``: per-group codes ``a [M, KQ]`` (scales ``xs [M, cdiv(KQ,
        GROUP)]``, outlier block ``xo [M, NO]``) times gate rows ``offs_n`` and up rows ``NA + offs_n`` of ``w``, as
        ``_splitk_gemm_kernel`` computes each (its ``GROUP`` path); the fixup as the module docstring says. ``h``:
        the activation ``[M, NA]``; ``cq``, ``cs``, ``co``: down's codes ``[M, KQD]``, scales ``[M, cdiv(KQD, BN)]``
        and outlier block ``[M, NOD]`` (``dest``: down's column map, ``-1 - slot`` at an outlier column)."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        mm = offs_m < M
        mn = offs_n < NA
        k_per = tl.cdiv(tl.cdiv(KQ, BK), SPLIT_K) * BK
        k_lo = pid_k * k_per
        k_hi = tl.minimum(KQ, k_lo + k_per)
        ws_g = tl.load(ws_ptr + offs_n, mask=mn, other=0.0)
        ws_u = tl.load(ws_ptr + NA + offs_n, mask=mn, other=0.0)
        dest = tl.load(dest_ptr + offs_n, mask=mn, other=0)
        if ONE_OUT:  # split 0 adds the outlier product
            offs_o = tl.arange(0, BNO)
            mo = offs_o < tl.where(pid_k == 0, NO, 0)
            wo_g = _outlier_weight_tile(wo_ptr, offs_n, mn, offs_o, mo, NO)
            wo_u = _outlier_weight_tile(wo_ptr, NA + offs_n, mn, offs_o, mo, NO)
        pdl_wait(PDL)
        a_rows = a_ptr + offs_m[:, None].to(tl.int64) * KQ
        g_rows = xs_ptr + offs_m.to(tl.int64) * tl.cdiv(KQ, GROUP)
        acc_g = _group_scaled_products(a_rows, w_ptr + offs_n[None, :].to(tl.int64) * KQ, g_rows, mm, mn, k_lo, k_hi,
                                       BM, BN, BK, GROUP, EVEN_K)
        acc_u = _group_scaled_products(a_rows, w_ptr + (NA + offs_n)[None, :].to(tl.int64) * KQ, g_rows, mm, mn,
                                       k_lo, k_hi, BM, BN, BK, GROUP, EVEN_K)
        pdl_release(PDL)
        y_g = acc_g * ws_g[None, :]
        y_u = acc_u * ws_u[None, :]
        if ONE_OUT:
            xo = tl.load(xo_ptr + offs_m[:, None].to(tl.int64) * NO + offs_o[None, :], mask=mm[:, None] & mo[None, :],
                         other=0.0)
            y_g = _add_outlier_product(y_g, xo, wo_g)
            y_u = _add_outlier_product(y_u, xo, wo_u)
        elif HAS_OUT and pid_k == 0:
            for o0 in range(0, NO, BNO):
                offs_o = o0 + tl.arange(0, BNO)
                mo = offs_o < NO
                xo = tl.load(xo_ptr + offs_m[:, None].to(tl.int64) * NO + offs_o[None, :],
                             mask=mm[:, None] & mo[None, :], other=0.0)
                y_g = _add_outlier_product(y_g, xo, _outlier_weight_tile(wo_ptr, offs_n, mn, offs_o, mo, NO))
                y_u = _add_outlier_product(y_u, xo, _outlier_weight_tile(wo_ptr, NA + offs_n, mn, offs_o, mo, NO))
        out_mask = mm[:, None] & mn[None, :]
        if SPLIT:
            N2 = 2 * NA
            mn_off = offs_m[:, None].to(tl.int64) * N2 + offs_n[None, :]
            MN = M.to(tl.int64) * N2
            tl.store(part_ptr + pid_k * MN + mn_off, y_g, mask=out_mask)
            tl.store(part_ptr + pid_k * MN + NA + mn_off, y_u, mask=out_mask)
            tile = pid_n * tl.num_programs(0) + pid_m
            if last_to_arrive(cnt_ptr, tile, SPLIT_K):
                # gate's and up's partials summed in one loop (int8's _summed_partials twice took 254 registers
                # against 226 at 64 x 128 over 8 warps, compiled for sm_90); each in split order as there
                tot_g = tl.zeros([BM, BN], dtype=tl.float32)
                tot_u = tl.zeros([BM, BN], dtype=tl.float32)
                for s in range(0, SPLIT_K):
                    tot_g += tl.load(part_ptr + s * MN + mn_off, mask=out_mask, other=0.0, cache_modifier=".cg")
                    tot_u += tl.load(part_ptr + s * MN + NA + mn_off, mask=out_mask, other=0.0, cache_modifier=".cg")
                _glu_codes(tot_g, tot_u, offs_m, offs_n, mm, mn, dest, pid_n, h_ptr, cq_ptr, cs_ptr, co_ptr, NA,
                           KQD, NOD, n_out_d, BN, SIGMOID)
                reset_counter(cnt_ptr, tile)
        else:
            _glu_codes(y_g, y_u, offs_m, offs_n, mm, mn, dest, pid_n, h_ptr, cq_ptr, cs_ptr, co_ptr, NA, KQD, NOD,
                       n_out_d, BN, SIGMOID)

    @triton.jit
    def _glu_codes(gate, up, offs_m, offs_n, mm, mn, dest, pid_n, h_ptr, cq_ptr, cs_ptr, co_ptr, NA, KQD, NOD, n_out_d,
                   BN: tl.constexpr, SIGMOID: tl.constexpr):
        """The summed gate and up tiles (float32) rounded to the output dtype as the GEMM stores them, ``act(gate) *
        up`` as ``_glu_group_kernel`` computes it, stored to ``h``, and down's codes of this group (``BN`` columns) of
        each token as ``store_group_token`` writes them: scales, codes, the outlier values to their slots (tile 0
        zeroes the slots past ``n_out_d``)."""
        dtype = h_ptr.dtype.element_ty
        af = rounded(gate, dtype)  # as stored by the GEMM and read back (a cast there and back Triton would fold)
        s = rounded(tl.sigmoid(af) if SIGMOID else af * tl.sigmoid(af), dtype)
        y = (s * rounded(up, dtype)).to(dtype)
        rows = offs_m[:, None].to(tl.int64)
        ok = mm[:, None] & mn[None, :]
        tl.store(h_ptr + rows * NA + offs_n[None, :], y, mask=ok)
        yf = y.to(tl.float32)
        v = tl.where(ok & (dest >= 0)[None, :], yf, 0.0)
        scale = row_absmax_scales(v)
        tl.store(cs_ptr + offs_m.to(tl.int64) * tl.cdiv(KQD, BN) + pid_n, scale, mask=mm)
        tl.store(cq_ptr + rows * KQD + offs_n[None, :], stored_int8_codes(v, scale[:, None]),
                 mask=mm[:, None] & (offs_n < KQD)[None, :])
        tl.store(co_ptr + rows * NOD + (-1 - dest)[None, :], yf.to(co_ptr.dtype.element_ty),
                 mask=ok & (dest < 0)[None, :])
        if pid_n == 0:
            opad = n_out_d + tl.arange(0, 16)
            tl.store(co_ptr + rows * NOD + opad[None, :], tl.zeros([1, 16], dtype=co_ptr.dtype.element_ty),
                     mask=mm[:, None] & (opad < NOD)[None, :])


def glu_config(M: int, NA: int, KQ: int, group: int, down_group: int, device: torch.device) -> dict:
    """Tiles of :func:`glu_codes_triton` (a rule, not yet swept): ``BN`` down's group, one K step a group of the
    input, the split filling the GPU's SMs once."""
    BM = min(64, max(16, next_power_of_2(M)))
    tiles = cdiv(M, BM) * cdiv(NA, down_group)
    BK = min(group, 256)
    return dict(BM=BM, BN=down_group, BK=BK, SPLIT_K=max(1, min(cdiv(KQ, BK), cdiv(sm_count(device, 4), tiles))),
                num_warps=8 if BM * down_group >= 64 * 128 else 4, num_stages=3)


def glu_codes_triton(codes, packed, down, activation: str = "silu", config: dict | None = None):
    """``(h, down's codes)`` for per-group ``codes`` ``(xq, xs, xo)`` of x through gate/up's stacked per-group weight
    ``packed`` (``[gate; up]``) and ``act(gate) * up``: ``h [M, NA]`` in xo's dtype and a
    :class:`~..rowwise.fused.GemmCodes` of ``down``'s per-group GEMM, as the GEMM and ``_glu_group_kernel`` give them
    for the same tiles. ``activation``: ``silu`` or ``sigmoid``. ``config``: :func:`glu_config`'s keys."""
    from ..rowwise.fused import empty_codes

    xq, xs, xo = codes
    M = xq.shape[0]
    if activation not in ("silu", "sigmoid"):
        raise ValueError(f"activation must be silu or sigmoid; got {activation!r}")
    if not glu_fixup_fits(packed, down, M):
        raise ValueError(f"gate/up's stacked weight {tuple(packed.qweight.shape)} (group {packed.group}) and down's "
                         f"(group {down.group}, {down.in_features} inputs) do not take the GLU fixup at {M} tokens")
    NA, KQ, NO = packed.qweight.shape[0] // 2, packed.qweight.shape[1], packed.outlier_idx.numel()
    cfg = dict(config or glu_config(M, NA, KQ, packed.group, down.group, xq.device))
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    if BN != down.group:
        raise ValueError(f"a tile must hold one of down's groups: BN {BN} != {down.group}")
    if BK % packed.group and packed.group % BK:
        raise ValueError(f"the K step ({BK}) must be a multiple or a divisor of the input's group ({packed.group})")
    n_m, n_n = cdiv(M, BM), cdiv(NA, BN)
    split = max(1, min(int(cfg["SPLIT_K"]), cdiv(KQ, BK)))
    if split > 1 and n_m * n_n > N_COUNTERS:
        raise ValueError(f"{n_m * n_n} tiles exceed the {N_COUNTERS} arrival counters")
    h = torch.empty(M, NA, dtype=xo.dtype, device=xq.device)
    out = empty_codes(M, down, xo.dtype, xq.device)
    bno = _bno(NO, xo.dtype)  # the split-K GEMM's outlier block width: the same product
    part = torch.empty((split, M, 2 * NA), dtype=torch.float32, device=xq.device) if split > 1 else h
    cnt = arrival_counters(xq.device) if split > 1 else packed.source
    launch_kernel(_splitk_glu_kernel, (n_m, n_n, split),
        xq, packed.qweight, xs, packed.scale, xo, packed.outlier_weight, h, part, cnt, down.dest, *out,
        M, NA, KQ, NO, split, down.qweight.shape[1], down.outlier_idx.numel(), down.n_out,
        BM=BM, BN=BN, BK=BK, BNO=bno, GROUP=packed.group, SPLIT=split > 1, HAS_OUT=NO > 0, ONE_OUT=0 < NO <= bno,
        EVEN_K=KQ % BK == 0, SIGMOID=activation == "sigmoid", num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **pdl_launch(xq.device, M))
    return h, out
