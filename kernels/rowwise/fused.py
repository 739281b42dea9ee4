"""Triton kernels for the row-wise ops of a decoder layer (spec: :mod:`.reference`).

Each replaces a chain of PyTorch elementwise and reduction launches with one: fla-style RMSNorm
with the residual add (the float32 upcasts, square, mean, rsqrt, scale, downcast and add of the
unfused module), the gated RMSNorm of a linear-attention output (``rmsnorm(o) * w * silu(g)``),
and SwiGLU's ``silu(gate) * up``. Rows may be strided views (a slice of a fused projection's
output): a row ``r`` starts at ``(r // inner) * s0 + (r % inner) * s1``, the last dimension
contiguous.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

MAX_ROW = 16384  # longer rows take the reference


def row_layout(t: torch.Tensor) -> tuple[int, int, int]:
    """``(s0, s1, inner)`` addressing the rows of ``t [..., N]`` (last dim contiguous), or raise."""
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


def _rows_block(n: int) -> tuple[int, int, int]:
    block_n = triton.next_power_of_2(n)
    rows = max(1, min(64, 4096 // block_n))
    return block_n, rows, 4 if block_n * rows <= 4096 else 8


if triton is not None:

    @triton.jit
    def _row_offsets(rows, s0, s1, inner):
        r = rows.to(tl.int64)
        return (r // inner) * s0 + (r % inner) * s1

    @triton.jit
    def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, g_ptr, y_ptr, ro_ptr, M, N, eps,
                         sx0, sx1, xin, sr0, sr1, rin, sg0, sg1, gin, sy0, sy1, yin, sro,
                         BLOCK_N: tl.constexpr, ROWS: tl.constexpr, HAS_RES: tl.constexpr, GATED: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        h = tl.load(x_ptr + _row_offsets(rows, sx0, sx1, xin)[:, None] + cols[None, :], mask=mask, other=0.0)
        dtype = h.dtype
        h = h.to(tl.float32)
        if HAS_RES:
            h += tl.load(r_ptr + _row_offsets(rows, sr0, sr1, rin)[:, None] + cols[None, :], mask=mask,
                         other=0.0).to(tl.float32)
            tl.store(ro_ptr + rows.to(tl.int64)[:, None] * sro + cols[None, :], h.to(dtype), mask=mask)
        rstd = tl.rsqrt(tl.sum(h * h, axis=1) / N + eps)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = h * rstd[:, None] * w[None, :]
        if GATED:
            g = tl.load(g_ptr + _row_offsets(rows, sg0, sg1, gin)[:, None] + cols[None, :], mask=mask,
                        other=0.0).to(tl.float32)
            y = y * (g * tl.sigmoid(g))
        tl.store(y_ptr + _row_offsets(rows, sy0, sy1, yin)[:, None] + cols[None, :], y.to(dtype), mask=mask)

    @triton.jit
    def _swiglu_kernel(a_ptr, b_ptr, y_ptr, M, N, sa0, sa1, ain, sb0, sb1, bin, sy,
                       BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        a = tl.load(a_ptr + _row_offsets(rows, sa0, sa1, ain)[:, None] + cols[None, :], mask=mask, other=0.0)
        b = tl.load(b_ptr + _row_offsets(rows, sb0, sb1, bin)[:, None] + cols[None, :], mask=mask, other=0.0)
        af = a.to(tl.float32)
        s = (af * tl.sigmoid(af)).to(a.dtype)  # silu rounds to the dtype before the product, as in PyTorch
        y = (s.to(tl.float32) * b.to(tl.float32)).to(a.dtype)
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * sy + cols[None, :], y, mask=mask)


def _launch_norm(x, weight, eps, residual=None, g=None):
    N = x.shape[-1]
    M = x.numel() // N if N else 0
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    ro = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else y
    if M:
        block_n, rows, warps = _rows_block(N)
        dummy = (0, 0, 1)
        _rms_norm_kernel[(triton.cdiv(M, rows),)](
            x, residual if residual is not None else x, weight, g if g is not None else x, y, ro, M, N, eps,
            *row_layout(x), *(row_layout(residual) if residual is not None else dummy),
            *(row_layout(g) if g is not None else dummy), *row_layout(y), N,
            BLOCK_N=block_n, ROWS=rows, HAS_RES=residual is not None, GATED=g is not None, num_warps=warps)
    return y, (ro if residual is not None else None)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Twin of :func:`.reference.rms_norm`: ``(out, x + residual)`` (None without a residual)."""
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} differs from x's {tuple(x.shape)}")
    return _launch_norm(x, weight, eps, residual=residual)


def gated_rms_norm_triton(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Twin of :func:`.reference.gated_rms_norm`."""
    if g.shape != x.shape:
        raise ValueError(f"gate shape {tuple(g.shape)} differs from x's {tuple(x.shape)}")
    return _launch_norm(x, weight, eps, g=g)[0]


def swiglu_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Twin of :func:`.reference.swiglu`; ``gate`` and ``up`` may be strided slices of one tensor."""
    if gate.shape != up.shape:
        raise ValueError(f"gate shape {tuple(gate.shape)} differs from up's {tuple(up.shape)}")
    N = gate.shape[-1]
    M = gate.numel() // N if N else 0
    y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if M:
        block_n = min(1024, triton.next_power_of_2(N))
        rows = max(1, 2048 // block_n)
        _swiglu_kernel[(triton.cdiv(M, rows), triton.cdiv(N, block_n))](
            gate, up, y, M, N, *row_layout(gate), *row_layout(up), N, BLOCK_N=block_n, ROWS=rows, num_warps=4)
    return y
