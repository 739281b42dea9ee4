"""Triton kernels: W8A8 int8 GEMM with an LLM.int8-style outlier split, one output.

Spec: :func:`laquant.kernels.gemm.reference.int8_outlier_linear` with per-token activations and
per-output-channel (or per-tensor) weight scales. Two launches:

1. ``_quantize_rows_kernel`` reads x once per row: the absmax over the non-outlier columns gives
   the token's scale, the kept columns are written as int8, packed (the weight's layout), and the
   outlier columns are gathered into a small dense ``[M, n_outliers]`` block;
2. ``_int8_gemm_kernel`` multiplies int8 x int8 into int32 accumulators on the tensor cores, and
   its epilogue dequantizes with the row and column scales, adds the outlier block times the
   bf16 outlier weights (a second, thin tensor-core product) and the bias, and writes y once.

The GEMM reads the module's own ``[N, n_keep]`` int8 weight (:class:`PackedOutlierWeight` holds no
copy of it), as plain row-major tiles. The quantization is a pass of its own before the GEMM, not
fused into the GEMM's main loop: the per-token scale needs the whole row first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl

    from ..common.triton_numerics import quantize_int8
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


@dataclass
class PackedOutlierWeight:
    """What the kernels read of a QuantLinear: ``qweight`` ``[N, n_keep]`` int8, its rows padded
    with zeros to a multiple of 16 (the module's own buffer, not a copy: the outlier columns are
    already left out), ``scale`` ``[N]`` float32,
    ``source`` ``[n_keep padded]`` int32 (the input column each int8 column holds, -1 in the padding),
    ``outlier_idx`` ``[n_out]`` int32 and ``outlier_weight`` ``[N, n_out]`` (model dtype)."""

    qweight: torch.Tensor
    scale: torch.Tensor
    source: torch.Tensor
    outlier_idx: torch.Tensor
    outlier_weight: torch.Tensor
    bias: torch.Tensor | None
    in_features: int

    @classmethod
    def pack(cls, qweight, weight_scale, keep_idx, outlier_idx, outlier_weight, bias, in_features):
        N = qweight.shape[0]
        if qweight.stride(0) % 16 or qweight.stride(1) != 1:
            raise ValueError("the int8 GEMM needs weight rows contiguous and padded to a multiple of 16")
        source = torch.full((qweight.shape[1],), -1, dtype=torch.int32, device=qweight.device)
        source[:keep_idx.numel()] = keep_idx.to(torch.int32)
        return cls(qweight, weight_scale.reshape(-1).float().expand(N).contiguous(), source,
                   outlier_idx.to(torch.int32).contiguous(), outlier_weight.contiguous(), bias, in_features)


if triton is not None:

    @triton.jit
    def _quantize_rows_kernel(x_ptr, source_ptr, idx_ptr, xq_ptr, xs_ptr, xo_ptr, KQ, NO, s_xm,
                              BK: tl.constexpr, BNO: tl.constexpr, HAS_OUT: tl.constexpr, ONE_TILE: tl.constexpr):
        # gathers the kept columns and stores the int8 row contiguously (vectorised stores; a scatter
        # to the compacted positions made this pass several times slower at large M * K)
        m = tl.program_id(0).to(tl.int64)
        row = x_ptr + m * s_xm
        out = xq_ptr + m * KQ
        if ONE_TILE:  # the whole row in registers: x is read once
            offs = tl.arange(0, BK)
            src = tl.load(source_ptr + offs, mask=offs < KQ, other=-1)
            x = tl.load(row + src, mask=src >= 0, other=0.0).to(tl.float32)
            scale = tl.maximum(tl.max(tl.abs(x), axis=0) / 127.0, 1.1754943508222875e-38)
            tl.store(xs_ptr + m, scale)
            tl.store(out + offs, quantize_int8(x, scale), mask=offs < KQ)
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
            tl.store(out + offs, quantize_int8(x, scale), mask=offs < KQ)

    @triton.jit
    def _int8_gemm_kernel(a_ptr, w_ptr, xs_ptr, ws_ptr, xo_ptr, wo_ptr, bias_ptr, y_ptr, M, N, K, NO, s_ym,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BNO: tl.constexpr,
                          GROUP_M: tl.constexpr, HAS_OUT: tl.constexpr, HAS_BIAS: tl.constexpr):
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
        acc = tl.zeros([BM, BN], dtype=tl.int32)
        for k0 in range(0, K, BK):
            mk = (k0 + offs_k) < K
            a = tl.load(a_ptrs, mask=mm[:, None] & mk[None, :], other=0)
            w = tl.load(w_ptrs, mask=mk[:, None] & mn[None, :], other=0)
            acc = tl.dot(a, w, acc, out_dtype=tl.int32)
            a_ptrs += BK
            w_ptrs += BK
        xs = tl.load(xs_ptr + offs_m, mask=mm, other=0.0)
        ws = tl.load(ws_ptr + offs_n, mask=mn, other=0.0)
        y = acc.to(tl.float32) * xs[:, None] * ws[None, :]
        if HAS_OUT:
            for o0 in range(0, NO, BNO):
                offs_o = o0 + tl.arange(0, BNO)
                mo = offs_o < NO
                xo = tl.load(xo_ptr + offs_m[:, None].to(tl.int64) * NO + offs_o[None, :],
                             mask=mm[:, None] & mo[None, :], other=0.0)
                wo = tl.load(wo_ptr + offs_n[None, :].to(tl.int64) * NO + offs_o[:, None],
                             mask=mo[:, None] & mn[None, :], other=0.0)
                if xo.dtype == tl.float32:
                    y += tl.dot(xo, wo.to(tl.float32), input_precision="ieee")
                else:
                    y += tl.dot(xo, wo.to(xo.dtype))
        if HAS_BIAS:
            y += tl.load(bias_ptr + offs_n, mask=mn, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None].to(tl.int64) * s_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=mm[:, None] & mn[None, :])


def gemm_config(M: int) -> dict:
    """Tiles by the number of rows, the fastest in tools/sweep_gemm.py on an H100 (4096^2
    and 2048^2 weights): 128 x 128 x 128 int8 tiles reach 950-1140 TOPS at M >= 2048."""
    if M <= 64:
        return dict(BM=64, BN=128, BK=128, GROUP_M=4, num_warps=8, num_stages=3)
    return dict(BM=128, BN=128, BK=128, GROUP_M=8, num_warps=4, num_stages=3)


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
        one_tile = KQ <= 8192
        _quantize_rows_kernel[(M,)](x2, packed.source, packed.outlier_idx, xq, xs, xo, KQ, NO, x2.stride(0),
                                    BK=triton.next_power_of_2(KQ) if one_tile else 2048,
                                    BNO=max(16, triton.next_power_of_2(NO)), HAS_OUT=NO > 0, ONE_TILE=one_tile,
                                    num_warps=4 if K <= 2048 else 8)
    return xq, xs, xo


def int8_outlier_linear_triton(x: torch.Tensor, packed: PackedOutlierWeight, config: dict | None = None) -> torch.Tensor:
    """``x [..., K]`` -> ``y [..., N]`` in x's dtype; the Triton twin of ``int8_outlier_linear``
    (per-token activations)."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use int8_outlier_linear")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, K = x2.shape
    N, KQ = packed.qweight.shape
    if packed.in_features != K:
        raise ValueError(f"input has {K} features, the layer {packed.in_features}")
    NO = packed.outlier_idx.numel()
    xq, xs, xo = quantize_rows(x2, packed)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    cfg = dict(gemm_config(M) if config is None else config)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    grid = (triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, cfg["BN"]),)
    if M:
        _int8_gemm_kernel[grid](xq, packed.qweight, xs, packed.scale, xo, packed.outlier_weight,
                                packed.bias if packed.bias is not None else xs, y, M, N, KQ, NO, y.stride(0),
                                BNO=min(64 if x.dtype != torch.float32 else 32, max(16, triton.next_power_of_2(NO))), HAS_OUT=NO > 0,
                                HAS_BIAS=packed.bias is not None, num_warps=warps, num_stages=stages, **cfg)
    return y.reshape(*shape[:-1], N)
