"""Triton kernels for the row-wise ops of a decoder layer (spec: :mod:`.reference`).

Each replaces a chain of PyTorch elementwise and reduction launches with one: fla-style RMSNorm
with the residual add (the float32 upcasts, square, mean, rsqrt, scale, downcast and add of the
unfused module), the gated RMSNorm of a linear-attention output (``rmsnorm(o) * w * silu(g)``, or
``sigmoid(g)``: Kimi Delta Attention's),
and the gated products ``act(gate) * up``: SwiGLU's (SiLU) and a gated softmax attention's output
(sigmoid). Rows may be strided views (a slice of a fused projection's output): a row ``r`` starts
at ``(r // inner) * s0 + (r % inner) * s1``, the last dimension contiguous.
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.pdl import pdl_launch
from ..common.sizes import cdiv, next_power_of_2
from .reference import GATE_ACTIVATIONS

try:
    import triton
    import triton.language as tl

    from ..common.pdl import pdl_prologue
    from ..common.triton_numerics import (rounded, store_codes, store_group_codes, store_group_token,
                                          store_outlier_slots, store_scattered_codes, store_token_codes,
                                          stored_int8_codes, token_code_map)
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

MAX_ROW = 16384  # longer rows take the reference
# a token's codes come from its row in registers (one program's, but for per-group SwiGLU): wider GEMMs quantize apart
MAX_CODES_WIDTH = 16384
# up to this many tokens a GEMM with outlier columns takes its codes scattered from the registers
# (store_scattered_codes); more read the stored row back (byte scatters were 2-2.5x slower at 4,096 tokens)
SCATTER_MAX_TOKENS = 256
# more tokens than this (prefill): a norm writes the codes of a GEMM with outlier columns for several tokens a
# program (TILED_TOKENS), the packed column map loaded once for them (H200, 4,096 x 2,048, 16 outliers: 36.5 ->
# 28.3 us at 2 tokens; without outliers one token a program stays faster). SwiGLU of per-token codes keeps one
# token a program: its rows walked in column blocks, several tokens a program, measured 0.72-1.33x by launch and
# shape, slower in the model (eval/results/prefill_codes_h200/)
TILED_CODES_MIN_TOKENS = 256
TILED_TOKENS = 2
# a per-group GEMM's codes from SwiGLU: this many columns a program (whole groups; a token's row over several)
GLU_GROUP_BLOCK = 1024
GLU_ACTIVATIONS = ("silu", "sigmoid")  # SwiGLU's; a gated attention output's ``o * sigmoid(gate)``


def row_layout(t: torch.Tensor) -> tuple[int, int, int]:
    """``(s0, s1, inner)`` addressing the rows of ``t [..., N]`` (last dim contiguous), or raise."""
    if t.is_contiguous():  # the common case, without the general walk below (this runs at every launch)
        return (t.shape[-1] if t.numel() > t.shape[-1] else 0), 0, 1
    if t.stride(-1) != 1:
        raise ValueError("rows must be contiguous in their last dimension")
    if t.dim() == 1:
        return 0, 0, 1
    lead = t.shape[:-1]
    strides = t.stride()[:-1]
    # collapse the leading dims into at most two levels that a row index can address
    dims = [(n, s) for n, s in zip(lead, strides) if n != 1] or [(1, 0)]
    merged = [dims[0]]
    for n, s in dims[1:]:
        pn, ps = merged[-1]
        if ps == n * s:
            merged[-1] = (pn * n, s)
        else:
            merged.append((n, s))
    if len(merged) == 1:
        return merged[0][1], 0, 1
    if len(merged) == 2:
        return merged[0][1], merged[1][1], merged[1][0]
    raise ValueError("rows of this view cannot be addressed with two strides")


def addressable_rows(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``(t, row_layout(t))`` where :func:`row_layout` addresses t's rows, else the same of a contiguous copy
    of t (a view such as a transposed head dimension's needs three strides)."""
    try:
        return t, row_layout(t)
    except ValueError:
        t = t.contiguous()
        return t, row_layout(t)


_NO_ROWS = (0, 0, 1)  # the row layout passed for an absent tensor


class GemmCodes(tuple):
    """A GEMM's W8A8 activation codes ``(xq, xs, xo)`` (a tuple: unpacked as before) with the packed weight
    they were made for (``packed``), so the GEMM that takes them need not look its weight up again."""

    packed = None

    def __new__(cls, codes, packed):
        out = super().__new__(cls, codes)
        out.packed = packed
        return out


def _rows_block(n: int) -> tuple[int, int, int]:
    block_n = next_power_of_2(n)
    rows = max(1, min(64, 4096 // block_n))
    return block_n, rows, 4 if block_n * rows <= 4096 else 8


if triton is not None:

    @triton.jit
    def _row_offsets(rows, s0, s1, inner):
        r = rows.to(tl.int64)
        return (r // inner) * s0 + (r % inner) * s1

    @triton.jit
    def _code_map(src_ptr, oidx_ptr, dest_ptr, col, ok, KQ, NO, BQ: tl.constexpr, BNO: tl.constexpr,
                  HAS_OUT: tl.constexpr, QUANT: tl.constexpr, IDENTITY: tl.constexpr, SCATTER: tl.constexpr):
        """The packed column maps of a GEMM with outlier columns, loaded at the start of the kernel, before
        its PDL wait: ``dest`` at the token's input columns ``col`` (``SCATTER``), else the map the codes
        are read back through (:func:`token_code_map`); placeholders otherwise."""
        src, idx, dest = tl.zeros([BQ], dtype=tl.int32), tl.zeros([BNO], dtype=tl.int32), col
        if QUANT and not IDENTITY:
            if SCATTER:
                dest = tl.load(dest_ptr + col, mask=ok, other=0)
            else:
                src, idx = token_code_map(src_ptr, oidx_ptr, KQ, NO, BQ, BNO, HAS_OUT)
        return src, idx, dest

    @triton.jit
    def _quant_epilogue(y, col, ok, y_ptr, width, src, oidx, dest, xq_ptr, xs_ptr, xo_ptr, KQ, NO, NK, NOUT,
                        BQ: tl.constexpr, BNO: tl.constexpr, HAS_OUT: tl.constexpr, IDENTITY: tl.constexpr,
                        SCATTER: tl.constexpr, GROUP: tl.constexpr = 0):
        """This program's token as the next GEMM's W8A8 codes: from registers (``y``, float32 as stored,
        at the token's input columns ``col``) where the GEMM keeps every column in order, or scattered
        from them through ``dest`` (``SCATTER``: decode sizes); else read back from the token's ``width``
        elements this program just stored at ``y_ptr``, through the packed column map (``src``, ``oidx``:
        :func:`_code_map`; outlier columns). ``GROUP``: per-group codes (:func:`store_group_codes`, ``y`` the
        token's whole row in order, ``dest`` loaded at it; ``NK`` then carries the outlier count: :func:`_codes`):
        the gated norms' (a plain norm and SwiGLU have per-group kernels of their own)."""
        tok = tl.program_id(0).to(tl.int64)
        if GROUP:
            store_group_codes(y, ok & (dest >= 0), xq_ptr + tok * KQ, xs_ptr + tok * tl.cdiv(KQ, GROUP), KQ, BQ, GROUP)
            store_outlier_slots(y, dest, ok, xo_ptr + tok * NO, NO, NK)
        elif IDENTITY:
            store_codes(y, col, ok, xq_ptr + tok * KQ, xs_ptr + tok, NK, KQ)
        elif SCATTER:
            store_scattered_codes(y, dest, ok, xq_ptr + tok * KQ, xs_ptr + tok, xo_ptr + tok * NO, NK, KQ, NO, NOUT)
        else:
            tl.debug_barrier()  # every thread's stores of y are visible to the whole program
            store_token_codes(y_ptr + tok * width, src, oidx, xq_ptr + tok * KQ, xs_ptr + tok,
                              xo_ptr + tok * NO, KQ, NO, BQ, BNO, HAS_OUT)

    @triton.jit
    def _tokens_codes(rows, row_ok, N, y_ptr, src, oidx, xq_ptr, xs_ptr, xo_ptr, KQ, NO, BQ: tl.constexpr,
                      BNO: tl.constexpr, HAS_OUT: tl.constexpr):
        """The codes of a program's tokens, one row of ``N`` each, stored contiguously at ``y_ptr``: per token what
        :func:`store_token_codes` writes, read back through the packed column map ``src`` and the outlier
        columns ``oidx``, loaded once for all of them."""
        r64 = rows.to(tl.int64)
        tl.debug_barrier()  # every thread's stores of y are visible to the whole program
        x = tl.load(y_ptr + r64[:, None] * N + src[None, :], mask=row_ok[:, None] & (src >= 0)[None, :],
                    other=0.0).to(tl.float32)
        offs = tl.arange(0, BQ)
        scale = tl.maximum(tl.max(tl.abs(x), axis=1) / 127.0, 1.1754943508222875e-38)
        tl.store(xs_ptr + rows, scale, mask=row_ok)
        tl.store(xq_ptr + r64[:, None] * KQ + offs[None, :], stored_int8_codes(x, scale[:, None]),
                 mask=row_ok[:, None] & (offs < KQ)[None, :])
        if HAS_OUT:
            offs_o = tl.arange(0, BNO)
            mo = row_ok[:, None] & (offs_o < NO)[None, :]
            tl.store(xo_ptr + r64[:, None] * NO + offs_o[None, :],
                     tl.load(y_ptr + r64[:, None] * N + oidx[None, :], mask=mo, other=0.0), mask=mo)

    @triton.jit
    def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, g_ptr, y_ptr, ro_ptr, M, N, eps,
                         sx0, sx1, xin, sr0, sr1, rin, sg0, sg1, gin, sy0, sy1, yin, sro,
                         src_ptr, oidx_ptr, xq_ptr, xs_ptr, xo_ptr, KQ, NO, NK, dest_ptr, NOUT, RPP,
                         BLOCK_N: tl.constexpr, ROWS: tl.constexpr, HAS_RES: tl.constexpr, GATED: tl.constexpr,
                         QUANT: tl.constexpr, BQ: tl.constexpr, BNO: tl.constexpr, HAS_OUT: tl.constexpr,
                         IDENTITY: tl.constexpr, SCATTER: tl.constexpr,
                         ROUND_SUM: tl.constexpr = False, ROUND_NORMED: tl.constexpr = False,
                         GATE_FIRST: tl.constexpr = False, W_PER_ROW: tl.constexpr = False,
                         SIGMOID_GATE: tl.constexpr = False, PDL: tl.constexpr = False, TOKENS: tl.constexpr = 1,
                         GROUP: tl.constexpr = 0):
        if QUANT:  # one token (RPP rows of y) per program, or TOKENS tokens of one row each (prefill sizes)
            local = tl.arange(0, ROWS)
            rows = tl.program_id(0) * (RPP * TOKENS) + local
            row_ok = (local < RPP * TOKENS) & (rows < M)
        else:
            local = tl.arange(0, ROWS)
            rows = tl.program_id(0) * ROWS + local
            row_ok = rows < M
        cols = tl.arange(0, BLOCK_N)
        mask = row_ok[:, None] & (cols < N)[None, :]
        token_col = local[:, None] * N + cols[None, :]
        src, oidx, dest = _code_map(src_ptr, oidx_ptr, dest_ptr, token_col, mask, KQ, NO, BQ, BNO, HAS_OUT, QUANT,
                                    IDENTITY, SCATTER)
        if W_PER_ROW:  # a weight per row of the token (a grouped norm's groups)
            row_in_token = local if QUANT else rows % RPP
            w = tl.load(w_ptr + row_in_token[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        else:  # loaded before the PDL wait, as the code map: a parameter, evicted from L2 since its last step
            w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        pdl_prologue(PDL)
        h = tl.load(x_ptr + _row_offsets(rows, sx0, sx1, xin)[:, None] + cols[None, :], mask=mask, other=0.0)
        dtype = h.dtype
        h = h.to(tl.float32)
        if HAS_RES:
            h += tl.load(r_ptr + _row_offsets(rows, sr0, sr1, rin)[:, None] + cols[None, :], mask=mask,
                         other=0.0).to(tl.float32)
            if ROUND_SUM:  # normalize the sum as stored (as a separate add would hand it over)
                h = rounded(h, dtype)
            tl.store(ro_ptr + rows.to(tl.int64)[:, None] * sro + cols[None, :], h.to(dtype), mask=mask)
        if GATED:
            g = tl.load(g_ptr + _row_offsets(rows, sg0, sg1, gin)[:, None] + cols[None, :], mask=mask,
                        other=0.0).to(tl.float32)
            gate = tl.sigmoid(g) if SIGMOID_GATE else g * tl.sigmoid(g)
            if GATE_FIRST:  # Mamba2's: the gated rows are normalized
                h = h * gate
        rstd = tl.rsqrt(tl.sum(h * h, axis=1) / N + eps)
        y = h * rstd[:, None]
        if ROUND_NORMED:  # Llama's rounding: the normalized rows in x's dtype, then the weight
            y = rounded(y, dtype)
        y = y * w
        if GATED and not GATE_FIRST:
            y = y * gate
        tl.store(y_ptr + _row_offsets(rows, sy0, sy1, yin)[:, None] + cols[None, :], y.to(dtype), mask=mask)
        if QUANT:
            if TOKENS > 1:  # a GEMM with outlier columns (the packed map), one row a token
                _tokens_codes(rows, row_ok, N, y_ptr, src, oidx, xq_ptr, xs_ptr, xo_ptr, KQ, NO, BQ, BNO, HAS_OUT)
            else:
                _quant_epilogue(rounded(y, dtype), token_col, mask, y_ptr, RPP * N, src, oidx, dest,
                                xq_ptr, xs_ptr, xo_ptr, KQ, NO, NK, NOUT, BQ, BNO, HAS_OUT, IDENTITY, SCATTER, GROUP)

    @triton.jit
    def _swiglu_kernel(a_ptr, b_ptr, y_ptr, M, N, sa0, sa1, ain, sb0, sb1, bin, sy,
                       src_ptr, oidx_ptr, xq_ptr, xs_ptr, xo_ptr, KQ, NO, NK,
                       BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                       QUANT: tl.constexpr, BQ: tl.constexpr, BNO: tl.constexpr, HAS_OUT: tl.constexpr,
                       IDENTITY: tl.constexpr,
                       SIGMOID: tl.constexpr = False, PDL: tl.constexpr = False):
        # the codes of a GEMM with outlier columns are read back, never scattered: a token's whole SwiGLU row in
        # one program scattered measured slower (5,632 columns: 6.7 -> 7.0 us, 11,008: 8.4 -> 11.4 us at 64 tokens)
        src, oidx, dest = _code_map(src_ptr, oidx_ptr, src_ptr, 0, False, KQ, NO, BQ, BNO, HAS_OUT, QUANT, IDENTITY,
                                    False)
        pdl_prologue(PDL)
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        a = tl.load(a_ptr + _row_offsets(rows, sa0, sa1, ain)[:, None] + cols[None, :], mask=mask, other=0.0)
        b = tl.load(b_ptr + _row_offsets(rows, sb0, sb1, bin)[:, None] + cols[None, :], mask=mask, other=0.0)
        af = a.to(tl.float32)
        # the activation rounds to the dtype before the product, as in PyTorch
        s = rounded(tl.sigmoid(af) if SIGMOID else af * tl.sigmoid(af), a.dtype)
        y = s * b.to(tl.float32)
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * sy + cols[None, :], y.to(a.dtype), mask=mask)
        if QUANT:  # one row per program, the whole row in one block
            _quant_epilogue(rounded(y, a.dtype), tl.broadcast_to(cols[None, :], y.shape), mask, y_ptr, sy, src, oidx,
                            dest, xq_ptr, xs_ptr, xo_ptr, KQ, NO, NK, 0, BQ, BNO, HAS_OUT, IDENTITY, False)

    @triton.jit
    def _glu_group_kernel(a_ptr, b_ptr, y_ptr, N, sa0, sa1, ain, sb0, sb1, bin, sy, dest_ptr, xq_ptr, xs_ptr, xo_ptr,
                          KQ, NO, n_out, GROUPS: tl.constexpr, GROUP: tl.constexpr, SIGMOID: tl.constexpr = False,
                          PDL: tl.constexpr = False):
        """``act(a) * b`` of one token and ``GROUPS`` whole groups of its columns, held a group a row, with their
        per-group codes (a per-group GEMM's: every column in order, ``dest`` the weight's map of the outlier
        columns): a group's scale needs no other group, so a token's row is spread over several programs, where
        per-token codes need it whole in one."""
        tok = tl.program_id(0)
        g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
        col = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        ok = col < N
        dest = tl.load(dest_ptr + col, mask=ok, other=0)
        pdl_prologue(PDL)
        a = tl.load(a_ptr + _row_offsets(tok, sa0, sa1, ain) + col, mask=ok, other=0.0)
        b = tl.load(b_ptr + _row_offsets(tok, sb0, sb1, bin) + col, mask=ok, other=0.0)
        af = a.to(tl.float32)
        s = rounded(tl.sigmoid(af) if SIGMOID else af * tl.sigmoid(af), a.dtype)
        y = (s * b.to(tl.float32)).to(a.dtype)
        tl.store(y_ptr + tok.to(tl.int64) * sy + col, y, mask=ok)
        store_group_token(y.to(tl.float32), col, g, ok, dest, tok, xq_ptr, xs_ptr, xo_ptr, KQ, NO, n_out, GROUP)

    @triton.jit
    def _rms_norm_group_kernel(x_ptr, r_ptr, w_ptr, y_ptr, ro_ptr, N, eps, sx0, sx1, xin, sr0, sr1, rin,
                               dest_ptr, xq_ptr, xs_ptr, xo_ptr, KQ, NO, n_out, GROUPS: tl.constexpr,
                               GROUP: tl.constexpr, HAS_RES: tl.constexpr, ROUND_SUM: tl.constexpr,
                               ROUND_NORMED: tl.constexpr, PDL: tl.constexpr = False):
        """:func:`_rms_norm_kernel` of one token with the per-group codes of its output (a per-group GEMM's), the row
        held a group a row (``[GROUPS, GROUP]``); y and the sum stored contiguous."""
        tok = tl.program_id(0)
        t64 = tok.to(tl.int64)
        g = tl.arange(0, GROUPS)
        col = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        ok = col < N
        dest = tl.load(dest_ptr + col, mask=ok, other=0)
        w = tl.load(w_ptr + col, mask=ok, other=0.0).to(tl.float32)
        pdl_prologue(PDL)
        h = tl.load(x_ptr + _row_offsets(tok, sx0, sx1, xin) + col, mask=ok, other=0.0)
        dtype = h.dtype
        h = h.to(tl.float32)
        if HAS_RES:
            h += tl.load(r_ptr + _row_offsets(tok, sr0, sr1, rin) + col, mask=ok, other=0.0).to(tl.float32)
            if ROUND_SUM:
                h = rounded(h, dtype)
            tl.store(ro_ptr + t64 * N + col, h.to(dtype), mask=ok)
        # summed a group at a time, then over the groups: within an ulp of the one-row kernel's (and PyTorch's)
        y = h * tl.rsqrt(tl.sum(tl.sum(h * h, axis=1), axis=0) / N + eps)
        if ROUND_NORMED:
            y = rounded(y, dtype)
        y = (y * w).to(dtype)
        tl.store(y_ptr + t64 * N + col, y, mask=ok)
        store_group_token(y.to(tl.float32), col, g, ok, dest, tok, xq_ptr, xs_ptr, xo_ptr, KQ, NO, n_out, GROUP)


def empty_codes(M: int, packed, dtype, device) -> GemmCodes:
    """Buffers for ``M`` tokens' W8A8 activation codes of ``packed``'s GEMM, as quantize_rows lays them out: int8
    codes ``[M, KQ]``, float32 scales ``[M]`` (``[M, cdiv(KQ, group)]`` for a per-group weight, as quantize_groups
    lays them out), the outlier block ``[M, NO]`` in ``dtype`` (one column without)."""
    KQ, NO = packed.qweight.shape[1], packed.outlier_idx.numel()
    scales = torch.empty(M, cdiv(KQ, packed.group), dtype=torch.float32, device=device) if packed.group else \
        torch.empty(M, dtype=torch.float32, device=device)
    return GemmCodes((torch.empty(M, KQ, dtype=torch.int8, device=device), scales,
                      torch.empty(M, max(NO, 1), dtype=dtype, device=device)), packed)


def codes_consts(packed) -> dict:
    """The constexprs of a kernel writing ``packed``'s codes through :func:`~..common.triton_numerics.token_code_map`:
    the packed row's and the outlier block's tile widths, and whether there are outlier columns."""
    KQ, NO = packed.qweight.shape[1], packed.outlier_idx.numel()
    return dict(BQ=next_power_of_2(KQ), BNO=max(16, next_power_of_2(NO)), HAS_OUT=NO > 0)


def _codes(M: int, packed, dtype, device, scatter: bool = False):
    """Empty W8A8 activation codes for ``packed`` (the GEMM's layout, as quantize_rows writes them)
    and the kernel arguments that fill them; None: no codes wanted. ``scatter``: for a kernel that can
    scatter them from its registers (the norms), which it does at up to :data:`SCATTER_MAX_TOKENS`."""
    if packed is None:
        return None, {}
    codes = empty_codes(M, packed, dtype, device)
    KQ, NO = packed.qweight.shape[1], packed.outlier_idx.numel()
    if packed.group:  # the gated norms' per-group codes from a token's rows in registers (store_group_codes): the
        # columns' dest map in the map's place (a per-group weight keeps every column in order), loaded at the token's
        # columns through the scatter map; the outlier count in n_keep's place
        if not scatter:
            raise ValueError("per-group codes come from the norms here (SwiGLU's: _glu_group_kernel)")
        ptrs = (packed.dest, packed.outlier_idx, *codes, KQ, NO, packed.n_out, packed.dest, packed.n_out)
        consts = dict(QUANT=True, **codes_consts(packed), GROUP=packed.group, IDENTITY=False, SCATTER=True)
        return codes, dict(ptrs=ptrs, consts=consts)
    consts = packed.host.get("codes_consts")
    if consts is None:
        consts = packed.host["codes_consts"] = dict(QUANT=True, **codes_consts(packed), IDENTITY=packed.identity)
    if scatter:
        return codes, dict(ptrs=(packed.source, packed.outlier_idx, *codes, KQ, NO, packed.n_keep, packed.dest,
                                 packed.n_out), consts=dict(consts, SCATTER=M <= SCATTER_MAX_TOKENS))
    return codes, dict(ptrs=(packed.source, packed.outlier_idx, *codes, KQ, NO, packed.n_keep), consts=dict(consts))


_NO_CODES = dict(consts=dict(QUANT=False, BQ=16, BNO=16, HAS_OUT=False, IDENTITY=True))


def _codes_warps(elements: int) -> int:
    """Warps of a program that holds a token's row of ``elements`` (a power of two) in registers."""
    return 4 if elements <= 2048 else 8 if elements <= 8192 else 16


def codes_fit(packed) -> bool:
    """Whether these kernels can write the W8A8 codes of ``packed``'s GEMM (its int8 width at most
    :data:`MAX_CODES_WIDTH`; a per-group weight's at least one group)."""
    width = packed.qweight.shape[1]
    return width <= MAX_CODES_WIDTH and width >= packed.group


def group_rows_fit(width: int, group: int) -> bool:
    """Whether a kernel holding a token as rows of ``width`` (a gated norm's heads) can write per-group codes of
    ``group`` columns from its registers: its tile of rows is then the token's columns in order, whole groups."""
    return width & (width - 1) == 0 and width % group == 0


def check_codes(packed, width: int) -> None:
    if packed is not None and (packed.in_features != width or not codes_fit(packed)):
        raise ValueError(f"codes for a GEMM of {packed.in_features} inputs (packed width {packed.qweight.shape[1]}, "
                         f"at most {MAX_CODES_WIDTH}) cannot come from rows of {width}")


def _launch_norm(x, weight, eps, residual=None, g=None, packed=None, heads: int = 1, round_sum: bool = False,
                 round_normed: bool = False, gate_first: bool = False, gate_activation: str = "silu"):
    """``heads``: rows per token (the gated norm's heads), for the codes of a whole token."""
    x, x_rows = addressable_rows(x)
    residual, res_rows = addressable_rows(residual) if residual is not None else (None, _NO_ROWS)
    g, g_rows = addressable_rows(g) if g is not None else (None, _NO_ROWS)
    N = x.shape[-1]
    M = x.numel() // N if N else 0
    check_codes(packed, heads * N)
    if weight.numel() not in (N, heads * N):
        raise ValueError(f"the norm's weight has {weight.numel()} elements: expected one per column ({N}) or per "
                         f"column of each of a token's {heads} rows ({heads * N})")
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    ro = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else y
    if packed is not None and packed.group and heads == 1 and g is None:  # a plain norm's per-group codes
        codes = _launch_group_norm(x, x_rows, residual, res_rows, weight, eps, y, ro, packed, round_sum, round_normed)
        return y, (ro if residual is not None else None), codes
    if packed is not None and packed.group and heads != 1 and not group_rows_fit(N, packed.group):
        raise ValueError(f"per-group codes from a norm of {heads} rows a token need rows of a power of two wide and "
                         f"a multiple of the group ({packed.group}), not {N}")
    codes, q = _codes(M // heads, packed, x.dtype, x.device, scatter=True)
    if M:
        block_n, rows, warps = _rows_block(N)
        ptrs = q.get("ptrs", (x, x, x, x, x, 0, 0, 0, x, 0))
        consts = q["consts"] if q else dict(_NO_CODES["consts"], SCATTER=False)
        tokens = 1
        if packed is not None:
            rows = next_power_of_2(heads)
            if heads == 1 and M > TILED_CODES_MIN_TOKENS and not packed.identity and not packed.group:  # tiles of 8K
                tokens = max(1, min(TILED_TOKENS, 8192 // max(block_n, consts["BQ"])))
                rows, consts = tokens, dict(consts, SCATTER=False)
        launch_kernel(_rms_norm_kernel, (cdiv(M // heads, tokens) if packed is not None else cdiv(M, rows),),
            x, residual if residual is not None else x, weight, g if g is not None else x, y, ro, M, N, eps,
            *x_rows, *res_rows, *g_rows, *row_layout(y), N, *ptrs, heads,
            BLOCK_N=block_n, ROWS=rows, HAS_RES=residual is not None, GATED=g is not None, ROUND_SUM=round_sum,
            ROUND_NORMED=round_normed, GATE_FIRST=gate_first, W_PER_ROW=weight.numel() != N,
            SIGMOID_GATE=gate_activation == "sigmoid", TOKENS=tokens,
            num_warps=warps if packed is None else _codes_warps(max(rows * block_n, tokens * consts["BQ"])),
            **consts, **pdl_launch(x.device, M // heads))
    return y, (ro if residual is not None else None), codes


def _group_codes(M: int, packed, dtype, device):
    """Empty per-group codes for ``M`` tokens of ``packed``'s GEMM and the arguments of a per-group producer kernel
    that fill them (``dest_ptr, xq_ptr, xs_ptr, xo_ptr, KQ, NO, n_out``)."""
    codes = empty_codes(M, packed, dtype, device)
    return codes, (packed.dest, *codes, packed.qweight.shape[1], packed.outlier_idx.numel(), packed.n_out)


def _launch_group_norm(x, x_rows, residual, res_rows, weight, eps, y, ro, packed, round_sum, round_normed):
    """:func:`_rms_norm_group_kernel` for :func:`_launch_norm` (its rows, checks and outputs made): a plain norm writing
    a per-group GEMM's codes, which it returns. (The row in one piece, as per-token codes take it, in the shared norm
    kernel measured 1.5-3x slower: eval/results/per_group_h200/.)"""
    N = x.shape[-1]
    M = x.numel() // N if N else 0
    codes, args = _group_codes(M, packed, x.dtype, x.device)
    groups = next_power_of_2(cdiv(packed.qweight.shape[1], packed.group))
    if M:
        launch_kernel(_rms_norm_group_kernel, (M,), x, residual if residual is not None else x, weight, y, ro, N, eps,
                      *x_rows, *res_rows, *args, GROUPS=groups, GROUP=packed.group, HAS_RES=residual is not None,
                      ROUND_SUM=round_sum, ROUND_NORMED=round_normed, num_warps=_codes_warps(groups * packed.group),
                      **pdl_launch(x.device, M))
    return codes


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                    packed=None, round_sum: bool = False, round_normed: bool = False):
    """Twin of :func:`.reference.rms_norm`: ``(out, x + residual)`` (None without a residual); with
    ``packed`` (a :class:`~..gemm.int8.PackedOutlierWeight`), also the W8A8 codes of ``out`` for
    that GEMM, ``(xq, xs, xo)``, as a third element (what :func:`~..gemm.int8.quantize_rows` of
    ``out`` gives, in the same launch)."""
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} differs from x's {tuple(x.shape)}")
    out, summed, codes = _launch_norm(x, weight, eps, residual=residual, packed=packed, round_sum=round_sum,
                                      round_normed=round_normed)
    return (out, summed) if packed is None else (out, summed, codes)


def gated_rms_norm_triton(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, eps: float, packed=None,
                          token_rows: int | None = None, gate_first: bool = False, round_normed: bool = False,
                          activation: str = "silu"):
    """Twin of :func:`.reference.gated_rms_norm` over ``x [..., H, D]`` (``gate_first``, ``round_normed``,
    ``activation`` as there; ``weight`` ``[D]``, or ``[H, D]``: one per row of a token); with ``packed``, also the W8A8
    codes of each token's ``H * D`` outputs for that GEMM: ``(out, (xq, xs, xo))``. ``token_rows``: the
    rows of one token where they span more than the last-but-one dimension (x and g ``[T, G, R, D]``,
    ``G * R`` rows a token: a gate whose rows only two strides address, such as qwen3_next's z read
    in place out of its fused projection)."""
    if g.shape != x.shape:
        raise ValueError(f"gate shape {tuple(g.shape)} differs from x's {tuple(x.shape)}")
    if activation not in GATE_ACTIVATIONS:
        raise ValueError(f"activation must be one of {GATE_ACTIVATIONS}; got {activation!r}")
    heads = token_rows if token_rows is not None else x.shape[-2]
    if packed is not None and x.numel() % (heads * x.shape[-1]):
        raise ValueError(f"{heads} rows a token do not divide x {tuple(x.shape)} into whole tokens")
    out, _, codes = _launch_norm(x, weight, eps, g=g, packed=packed, heads=heads, round_normed=round_normed,
                                 gate_first=gate_first, gate_activation=activation)
    return out if packed is None else (out, codes)


def glu_triton(gate: torch.Tensor, up: torch.Tensor, packed=None, activation: str = "silu"):
    """Twin of :func:`.reference.glu`; ``gate`` and ``up`` may be strided slices of one tensor.
    With ``packed``, also the W8A8 codes of the output for that GEMM: ``(out, (xq, xs, xo))``."""
    if activation not in GLU_ACTIVATIONS:
        raise ValueError(f"activation must be one of {GLU_ACTIVATIONS}; got {activation!r}")
    if gate.shape != up.shape:
        raise ValueError(f"gate shape {tuple(gate.shape)} differs from up's {tuple(up.shape)}")
    (gate, gate_rows), (up, up_rows) = addressable_rows(gate), addressable_rows(up)
    N = gate.shape[-1]
    M = gate.numel() // N if N else 0
    check_codes(packed, N)
    y = torch.empty_like(gate, memory_format=torch.contiguous_format)
    if packed is not None and packed.group:
        codes, args = _group_codes(M, packed, gate.dtype, gate.device)
        if M:
            groups = max(1, GLU_GROUP_BLOCK // packed.group)
            launch_kernel(_glu_group_kernel, (M, cdiv(packed.qweight.shape[1], groups * packed.group)),
                          gate, up, y, N, *gate_rows, *up_rows, N, *args, GROUPS=groups, GROUP=packed.group,
                          SIGMOID=activation == "sigmoid", num_warps=4, **pdl_launch(gate.device, M))
        return y, codes
    codes, q = _codes(M, packed, gate.dtype, gate.device)
    if M:
        if packed is None:
            block_n = min(1024, next_power_of_2(N))
            rows = max(1, 2048 // block_n)
        else:  # a token's whole row in one program
            block_n, rows = next_power_of_2(N), 1
        ptrs = q.get("ptrs", (gate, gate, gate, gate, gate, 0, 0, 0))
        launch_kernel(_swiglu_kernel, (cdiv(M, rows), cdiv(N, block_n)),
            gate, up, y, M, N, *gate_rows, *up_rows, N, *ptrs, BLOCK_N=block_n, ROWS=rows,
            num_warps=_codes_warps(block_n) if packed is not None else 4 if block_n <= 2048 else 8,
            SIGMOID=activation == "sigmoid", **(q or _NO_CODES)["consts"],
            **pdl_launch(gate.device, M))
    return y if packed is None else (y, codes)


def swiglu_triton(gate: torch.Tensor, up: torch.Tensor, packed=None):
    """Twin of :func:`.reference.swiglu`: :func:`glu_triton` with SiLU."""
    return glu_triton(gate, up, packed)
