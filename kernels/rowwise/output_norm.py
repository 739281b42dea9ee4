"""A linear-attention mixer's gated output norm inside its decode kernel (GLA's, the gated delta rule's and KDA's).

Each program of a decode kernel holds one (sequence, head)'s V outputs in registers; :func:`gated_output_norm` rounds
them as the stored output would be rounded and stores ``o * rsqrt(mean(o^2) + eps) * w * act(z)`` (act: ``z
sigmoid(z)``, or ``sigmoid(z)``: KDA's), what :func:`~.fused.gated_rms_norm_triton` gives on that output. With the
next GEMM's W8A8 codes, the token's last head to finish (an arrival counter per token,
:mod:`..common.counters`) reads the token's row back from L2 and writes its codes, as the norm kernel's read-back
path does. :func:`output_norm_args` makes the launch arguments.
"""

from __future__ import annotations

from ..common.counters import arrival_counters

try:
    import triton
    import triton.language as tl

    from ..common.triton_numerics import store_token_codes, token_code_map
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

ACTIVATIONS = ("silu", "sigmoid")


if triton is not None:

    @triton.jit
    def gated_output_norm(o, b, h, offs_v, mask_v, o_ptr, s_ob, s_oh, z_ptr, s_zb, s_zg, s_zr, z_group, nw_ptr, eps,
                          src_ptr, oidx_ptr, xq_ptr, xs_ptr, xo_ptr, cnt_ptr, KQ, NO, H: tl.constexpr,
                          V: tl.constexpr, CODES: tl.constexpr, BQ: tl.constexpr, BNO: tl.constexpr,
                          HAS_OUT: tl.constexpr, SIGMOID_GATE: tl.constexpr):
        """Head ``h`` of sequence ``b``: its float32 output ``o`` through the gated output norm, stored at ``o_ptr``;
        its gate row at ``z + b s_zb + (h // z_group) s_zg + (h % z_group) s_zr`` (heads grouped as a fused
        projection lays them out, or ``z_group`` 1). ``CODES``: the token's last head writes the codes."""
        dtype = o_ptr.dtype.element_ty
        b64 = b.to(tl.int64)
        x = o.to(dtype, fp_downcast_rounding="rtne").to(tl.float32)
        z_row = z_ptr + b64 * s_zb + (h // z_group) * s_zg + (h % z_group) * s_zr
        z = tl.load(z_row + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / V + eps)
        y = x * rstd
        y = y * tl.load(nw_ptr + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        if SIGMOID_GATE:
            y = y * tl.sigmoid(z)
        else:
            y = y * (z * tl.sigmoid(z))
        tl.store(o_ptr + b64 * s_ob + h * s_oh + offs_v, y.to(dtype), mask=mask_v)
        if CODES:
            tl.debug_barrier()  # every thread's part of the row is stored before the count is raised
            arrived = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel", scope="gpu")
            if arrived == H - 1:
                src, idx = token_code_map(src_ptr, oidx_ptr, KQ, NO, BQ, BNO, HAS_OUT)
                store_token_codes(o_ptr + b64 * s_ob, src, idx, xq_ptr + b64 * KQ, xs_ptr + b, xo_ptr + b64 * NO, KQ,
                                  NO, BQ, BNO, HAS_OUT, True)
                tl.atomic_xchg(cnt_ptr + b, 0, sem="relaxed", scope="gpu")  # ready for the next launch


def output_norm_args(norm, packed, o, activation: str = "silu"):
    """A decode kernel's gated-output-norm arguments (placeholders without ``norm``) and the codes' buffers.

    ``norm`` ``(z, weight, eps)``: z ``[B, H, V]``, or ``[B, G, R, V]`` (``G * R = H`` heads grouped, as qwen3_next's
    fused projection lays its gate out), its last dimension contiguous; weight ``[V]``. ``packed``: also the W8A8
    codes of each token's ``H * V`` outputs for that GEMM (o must be contiguous). Returns ``(dict(ptrs=..., consts=...),
    codes or None)``."""
    if norm is None:
        if packed is not None:
            raise ValueError("codes for the next GEMM come with the gated output norm: pass norm=(z, weight, eps)")
        return dict(ptrs=(o, 0, 0, 0, 1, o, 0.0, o, o, o, o, o, o, 0, 0), consts={}), None
    from .fused import check_codes, codes_consts, empty_codes

    z, weight, eps = norm
    B, H, V = o.shape
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    grouped = z.dim() == 4
    if (z.shape[0] != B or z.shape[-1] != V or z.stride(-1) != 1
            or (z.shape[1] * z.shape[2] if grouped else z.shape[1]) != H or z.dim() not in (3, 4)):
        raise ValueError(f"the output gate z must be [B, H, V] = {(B, H, V)} or [B, G, R, V] with G * R = {H}, "
                         f"V contiguous; got {tuple(z.shape)} strides {z.stride()}")
    if weight.numel() != V:
        raise ValueError(f"the output norm's weight has {weight.numel()} elements, not one per head column ({V})")
    z_layout = (z.stride(0), z.stride(1), z.stride(2), z.shape[2]) if grouped else (z.stride(0), z.stride(1), 0, 1)
    consts = dict(GNORM=True, SIGMOID_GATE=activation == "sigmoid")
    if packed is None:
        return dict(ptrs=(z, *z_layout, weight, eps, o, o, o, o, o, o, 0, 0), consts=consts), None
    check_codes(packed, H * V)
    if not o.is_contiguous():
        raise ValueError("the codes of a token are read back from its output row: out must be contiguous")
    codes = empty_codes(B, packed, o.dtype, o.device)
    KQ, NO = packed.qweight.shape[1], packed.outlier_idx.numel()
    consts.update(CODES=True, **codes_consts(packed))
    ptrs = (z, *z_layout, weight, eps, packed.source, packed.outlier_idx, *codes, arrival_counters(o.device), KQ, NO)
    return dict(ptrs=ptrs, consts=consts), codes
