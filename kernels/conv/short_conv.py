"""One decode token through a short depthwise causal conv (the ``conv1d`` before q, k, v in Gated
DeltaNet, Qwen3-Next, Mamba2, KDA and fla's GLA with ``use_short_conv``), in one launch.

In PyTorch a decode token's conv is about six launches: the cat of the kept inputs and the token,
a contiguous copy for the conv, the conv, the activation, and the copy that shifts the kept inputs
(plus, in Qwen3-Next, the cat that gathers q, k and v out of the fused projection's per-head layout).
:func:`short_conv_step_triton` reads the token where the projection wrote it (``cols``: which of its
columns are the conv's channels), sums the ``W`` taps in float32, applies the activation and shifts
the kept inputs, which it may do in place.

Spec: :func:`short_conv_step`. Its numerics are the model path's (``F.conv1d`` in the conv weight's
dtype: float32 sums rounded to it, then the activation in that dtype); the taps are summed in another
order than PyTorch's conv kernels, so the two agree to the rounding of that dtype, not bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.launch import launch_kernel
from ..common.pdl import pdl_launch
from ..common.sizes import cdiv, next_power_of_2

try:
    import triton
    import triton.language as tl

    from ..common.pdl import pdl_prologue
    from ..common.triton_numerics import rounded
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

ACTIVATIONS = (None, "silu", "swish")  # transformers' names; swish is silu


def _check(x, state, weight, bias, activation, cols, state_out):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    if x.dim() != 2 or state.dim() != 3 or weight.dim() != 2:
        raise ValueError(f"expected x [B, N], state [B, W - 1, C], weight [C, W]; got {tuple(x.shape)}, "
                         f"{tuple(state.shape)}, {tuple(weight.shape)}")
    B, Wm1, C = state.shape
    if weight.shape != (C, Wm1 + 1) or x.shape[0] != B:
        raise ValueError(f"state {tuple(state.shape)} does not fit weight {tuple(weight.shape)} or x {tuple(x.shape)}")
    if (cols.shape != (C,)) if cols is not None else x.shape[1] != C:
        raise ValueError(f"x has {x.shape[1]} columns; the conv {C} channels (pass cols to gather them)")
    if bias is not None and bias.shape != (C,):
        raise ValueError(f"bias must be [{C}]; got {tuple(bias.shape)}")
    if state_out is not None and (state_out.shape != state.shape or state_out.stride(-1) != 1):
        raise ValueError("state_out must have the state's shape and contiguous channels")


def short_conv_step(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    activation: str | None, cols: torch.Tensor | None = None,
                    state_out: torch.Tensor | None = None) -> torch.Tensor:
    """``out [B, C]`` in x's dtype for one token ``x [B, N]`` (its columns ``cols [C]``, or all of
    them), the kept inputs ``state [B, W - 1, C]`` (oldest first), ``weight [C, W]`` and ``bias [C]``.
    The kept inputs shifted by the token go to ``state_out`` (default: ``state`` itself, in place)."""
    _check(x, state, weight, bias, activation, cols, state_out)
    token = x if cols is None else x.index_select(1, cols.long())
    inp = torch.cat([state.to(x.dtype), token[:, None]], 1)  # [B, W, C]
    out = (inp.to(weight.dtype).to(torch.float32) * weight.t().to(torch.float32)).sum(1)
    if bias is not None:
        out = out + bias.to(torch.float32)
    out = out.to(weight.dtype)
    if activation is not None:
        out = F.silu(out)
    (state if state_out is None else state_out).copy_(inp[:, 1:])
    return out.to(x.dtype)


if triton is not None:

    @triton.jit
    def _short_conv_step_kernel(x_ptr, cols_ptr, s_ptr, so_ptr, w_ptr, b_ptr, out_ptr, C, s_xb, s_xc, s_sb, s_sw,
                                s_ob, s_ow, W: tl.constexpr, BLOCK_W: tl.constexpr, GATHER: tl.constexpr,
                                HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        """Tap ``t`` of the conv reads kept input ``t`` (the token at ``t = W - 1``). Every load is issued
        before the first store: a store to the kept inputs could alias a later load (in place), which
        would make the loads wait for it one after another."""
        pdl_prologue(PDL)
        b = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        t = tl.arange(0, BLOCK_W)[:, None]
        mask = c < C
        col = tl.load(cols_ptr + c, mask=mask, other=0) if GATHER else c
        token = tl.load(x_ptr + b * s_xb + col.to(tl.int64) * s_xc, mask=mask, other=0.0)
        kept_ptrs = s_ptr + b * s_sb + t * s_sw + c[None, :]
        kept = tl.load(kept_ptrs, mask=(t < W - 1) & mask[None, :], other=0.0)
        after = tl.load(kept_ptrs + s_sw, mask=(t < W - 2) & mask[None, :], other=0.0)  # kept input t + 1
        taps = tl.load(w_ptr + c[None, :] * W + t, mask=(t < W) & mask[None, :], other=0.0).to(tl.float32)
        if HAS_BIAS:
            bias = tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
        wdt = w_ptr.dtype.element_ty
        inp = tl.where(t == W - 1, token[None, :].to(wdt), kept.to(token.dtype).to(wdt)).to(tl.float32)
        acc = tl.sum(inp * taps, axis=0)
        if HAS_BIAS:
            acc += bias
        shifted = tl.where(t == W - 2, token[None, :].to(so_ptr.dtype.element_ty), after.to(so_ptr.dtype.element_ty))
        tl.store(so_ptr + b * s_ob + t * s_ow + c[None, :], shifted, mask=(t < W - 1) & mask[None, :])
        y = acc.to(wdt)
        if SILU:
            yf = rounded(acc, wdt)
            y = (yf / (1.0 + tl.exp(-yf))).to(wdt)
        tl.store(out_ptr + b * C + c, y.to(out_ptr.dtype.element_ty), mask=mask)


def short_conv_step_triton(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           activation: str | None, cols: torch.Tensor | None = None,
                           state_out: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of :func:`short_conv_step`, one launch. ``x`` may have any strides; the state's (and
    ``state_out``'s) channels and the weight must be contiguous."""
    _check(x, state, weight, bias, activation, cols, state_out)
    if state.stride(-1) != 1 or not weight.is_contiguous():
        raise ValueError("the kernel needs contiguous state channels and a contiguous [C, W] weight")
    if cols is not None and cols.dtype != torch.int32:
        raise TypeError(f"cols must be int32; got {cols.dtype}")
    B, Wm1, C = state.shape
    if Wm1 < 1:
        raise ValueError("a conv of width 1 keeps no inputs; it is not a short conv")
    so = state if state_out is None else state_out
    out = torch.empty(B, C, dtype=x.dtype, device=x.device)
    if B and C:
        block = min(512, next_power_of_2(C))
        launch_kernel(_short_conv_step_kernel, (B, cdiv(C, block)),
            x, cols if cols is not None else x, state, so, weight, bias if bias is not None else weight, out, C,
            *x.stride(), state.stride(0), state.stride(1), so.stride(0), so.stride(1), W=Wm1 + 1,
            BLOCK_W=next_power_of_2(Wm1 + 1),
            GATHER=cols is not None, HAS_BIAS=bias is not None, SILU=activation is not None, BLOCK_C=block,
            num_warps=4, **pdl_launch(x.device, B))
    return out
