"""A short depthwise causal conv (the ``conv1d`` before q, k, v in Gated DeltaNet, Qwen3-Next, Mamba2, KDA and
fla's GLA with ``use_short_conv``) in one launch: a decode token (:func:`short_conv_step_triton`) and a prompt
(:func:`short_conv_triton`).

In PyTorch a decode token's conv is about six launches: the cat of the kept inputs and the token,
a contiguous copy for the conv, the conv, the activation, and the copy that shifts the kept inputs
(plus, in Qwen3-Next, the cat that gathers q, k and v out of the fused projection's per-head layout).
:func:`short_conv_step_triton` reads the token where the projection wrote it (``cols``: which of its
columns are the conv's channels), sums the ``W`` taps in float32, applies the activation and shifts
the kept inputs, which it may do in place. A prompt's conv took as many launches, among them PyTorch's
depthwise conv kernel, slow on these shapes (46 us a layer for 512 tokens x 8,192 channels, 8 MB in and
out, in a 2.25B Qwen3-Next-style prefill on the H200: ``eval/results/moe_experts_h200/run4_verify/``);
:func:`short_conv_triton` reads the prompt in place, gathers its columns and the kept inputs before it,
and writes the outputs and the inputs to keep.

Spec: :func:`short_conv_step` and :func:`short_conv_reference`. Their numerics are the model path's
(``F.conv1d`` in the conv weight's dtype: float32 sums rounded to it, then the activation in that dtype);
the taps are summed in another order than PyTorch's conv kernels, so the two agree to the rounding of that
dtype, not bit for bit.
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


def _check_channels(activation, columns: int, C: int, cols, bias):
    """What a token's and a prompt's checks share: the activation, x's ``columns`` against the conv's ``C`` channels
    (or the ``cols`` gathering them), the bias."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    if (cols.shape != (C,)) if cols is not None else columns != C:
        raise ValueError(f"x has {columns} columns; the conv {C} channels (pass cols to gather them)")
    if bias is not None and bias.shape != (C,):
        raise ValueError(f"bias must be [{C}]; got {tuple(bias.shape)}")


def _check(x, state, weight, bias, activation, cols, state_out):
    if x.dim() != 2 or state.dim() != 3 or weight.dim() != 2:
        raise ValueError(f"expected x [B, N], state [B, W - 1, C], weight [C, W]; got {tuple(x.shape)}, "
                         f"{tuple(state.shape)}, {tuple(weight.shape)}")
    B, Wm1, C = state.shape
    if weight.shape != (C, Wm1 + 1) or x.shape[0] != B:
        raise ValueError(f"state {tuple(state.shape)} does not fit weight {tuple(weight.shape)} or x {tuple(x.shape)}")
    _check_channels(activation, x.shape[1], C, cols, bias)
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


def _check_prompt(x, prev, weight, bias, activation, cols, mask=None):
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[1] < 2:
        raise ValueError(f"expected x [B, T, N] and weight [C, W] with W >= 2; got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")
    C, W = weight.shape
    _check_channels(activation, x.shape[2], C, cols, bias)
    if prev is not None and prev.shape != (x.shape[0], W - 1, C):
        raise ValueError(f"the kept inputs must be [B, W - 1, C] = [{x.shape[0]}, {W - 1}, {C}]; "
                         f"got {tuple(prev.shape)}")
    if mask is not None and tuple(mask.shape) != tuple(x.shape[:2]):
        raise ValueError(f"mask must be [B, T] = {list(x.shape[:2])}; got {tuple(mask.shape)}")


def last_real(mask: torch.Tensor) -> torch.Tensor:
    """Each row's last real token's position + 1 (0: none) of a padding mask ``[B, T]`` (nonzero: a real token)."""
    return (mask.long() * torch.arange(1, mask.shape[1] + 1, device=mask.device)).amax(-1)


def short_conv_reference(x: torch.Tensor, prev: torch.Tensor | None, weight: torch.Tensor,
                         bias: torch.Tensor | None, activation: str | None, cols: torch.Tensor | None = None,
                         mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B, T, C], kept [B, W - 1, C])``, both in x's dtype, of a prompt ``x [B, T, N]`` (its columns ``cols
    [C]``, or all of them) after the kept inputs ``prev [B, W - 1, C]`` (None: zeros): at every position
    :func:`short_conv_step`'s formula; ``kept`` the last ``W - 1`` inputs. ``mask [B, T]``: padding (0) is no input
    (x times the mask), and ``kept`` the ``W - 1`` inputs that end at each row's last real token."""
    _check_prompt(x, prev, weight, bias, activation, cols, mask)
    B, T = x.shape[:2]
    C, W = weight.shape
    seq = x if cols is None else x.index_select(2, cols.long())
    if mask is not None:
        seq = seq * mask[:, :, None].to(seq.dtype)
    prev = seq.new_zeros(B, W - 1, C) if prev is None else prev.to(x.dtype)
    inp = torch.cat([prev, seq], 1)  # [B, W - 1 + T, C]
    windows = inp.unfold(1, W, 1)  # [B, T, C, W]: position t's inputs t .. t + W - 1 of inp
    out = (windows.to(weight.dtype).to(torch.float32) * weight.to(torch.float32)).sum(-1)
    if bias is not None:
        out = out + bias.to(torch.float32)
    out = out.to(weight.dtype)
    if activation is not None:
        out = F.silu(out)
    end = torch.full((B,), T, device=x.device) if mask is None else last_real(mask).to(x.device)
    idx = end[:, None] + torch.arange(W - 1, device=x.device)  # rows of inp
    return out.to(x.dtype), inp.gather(1, idx[..., None].expand(B, W - 1, C))


if triton is not None:

    @triton.jit
    def _short_conv_kernel(x_ptr, cols_ptr, p_ptr, m_ptr, last_ptr, w_ptr, b_ptr, out_ptr, k_ptr, T, C, s_xb, s_xt,
                           s_xc, s_pb, s_pw, s_mb, s_mt, W: tl.constexpr, GATHER: tl.constexpr,
                           HAS_PREV: tl.constexpr, MASKED: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                           KEEP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        """Rows ``BLOCK_T`` of the prompt and channels ``BLOCK_C``: tap ``j`` of output ``t`` reads input
        ``t - (W - 1) + j``, from the prompt (times its mask), or before it from the kept inputs. The programs of
        the first rows also write the ``W - 1`` inputs to keep, those that end at the row's last real token.

        Gathered channels whose columns are one run (consecutive, the first a multiple of 16 bytes: qwen3_next's q, k
        and v are runs of a head's 128 columns in its fused projection) are read as one: the compiler can then
        vectorize the loads, which it cannot for columns read from a table (~200 against ~2,300 GB/s on an H100,
        eval/results/graphed_hybrid_prefill_h100/)."""
        b = tl.program_id(0).to(tl.int64)
        pid_t = tl.program_id(1)
        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        lane = tl.arange(0, BLOCK_C)
        c = tl.program_id(2) * BLOCK_C + lane
        c_ok = c < C
        x_row = x_ptr + b * s_xb
        if GATHER:
            col = tl.load(cols_ptr + c, mask=c_ok, other=0).to(tl.int64)
            first = tl.load(cols_ptr + tl.program_id(2) * BLOCK_C).to(tl.int64)  # a program's first channel exists
            ALIGN: tl.constexpr = 16 // (x_ptr.dtype.element_ty.primitive_bitwidth // 8)  # elements in 16 bytes
            off_run = tl.max(tl.where(c_ok, tl.abs(col - first - lane), 0), axis=0)
            if (off_run == 0) & (first % ALIGN == 0):
                # first // ALIGN * ALIGN is first here, and its alignment the compiler's own to prove (a hint on first
                # would hold for it outside this branch too)
                _conv_rows(x_row + first // ALIGN * ALIGN * s_xc, lane.to(tl.int64), t, c, c_ok, b, pid_t, T,
                           C, p_ptr, m_ptr, last_ptr, w_ptr, b_ptr, out_ptr, k_ptr, s_xt, s_xc, s_pb, s_pw,
                           s_mb, s_mt, W, HAS_PREV, MASKED, HAS_BIAS, SILU, KEEP, BLOCK_T, BLOCK_C)
            else:
                _conv_rows(x_row, col, t, c, c_ok, b, pid_t, T, C, p_ptr, m_ptr, last_ptr, w_ptr, b_ptr,
                           out_ptr, k_ptr, s_xt, s_xc, s_pb, s_pw, s_mb, s_mt, W, HAS_PREV, MASKED, HAS_BIAS, SILU,
                           KEEP, BLOCK_T, BLOCK_C)
        else:
            _conv_rows(x_row, c.to(tl.int64), t, c, c_ok, b, pid_t, T, C, p_ptr, m_ptr, last_ptr, w_ptr,
                       b_ptr, out_ptr, k_ptr, s_xt, s_xc, s_pb, s_pw, s_mb, s_mt, W, HAS_PREV, MASKED, HAS_BIAS, SILU,
                       KEEP, BLOCK_T, BLOCK_C)

    @triton.jit
    def _conv_rows(x_cols, col, t, c, c_ok, b, pid_t, T, C, p_ptr, m_ptr, last_ptr, w_ptr, b_ptr, out_ptr,
                   k_ptr, s_xt, s_xc, s_pb, s_pw, s_mb, s_mt, W: tl.constexpr, HAS_PREV: tl.constexpr,
                   MASKED: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, KEEP: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        """The program's tile: channels ``c`` read at ``x_cols + col * s_xc`` of each row."""
        wdt = w_ptr.dtype.element_ty
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(W):
            src = t - (W - 1) + j
            ok = (t < T)[:, None] & c_ok[None, :]
            v = tl.load(x_cols + src[:, None].to(tl.int64) * s_xt + col[None, :] * s_xc,
                        mask=ok & (src >= 0)[:, None], other=0.0)
            if MASKED:
                m = tl.load(m_ptr + b * s_mb + src * s_mt, mask=(t < T) & (src >= 0), other=0)
                v = v * m.to(v.dtype)[:, None]
            if HAS_PREV:
                before = tl.load(p_ptr + b * s_pb + (W - 1 + src)[:, None] * s_pw + c[None, :],
                                 mask=ok & (src < 0)[:, None], other=0.0)
                v = tl.where((src >= 0)[:, None], v, before.to(v.dtype))
            tap = tl.load(w_ptr + c * W + j, mask=c_ok, other=0.0).to(tl.float32)
            acc += v.to(wdt).to(tl.float32) * tap[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        y = acc.to(wdt)
        if SILU:
            yf = rounded(acc, wdt)
            y = (yf / (1.0 + tl.exp(-yf))).to(wdt)
        ok = (t < T)[:, None] & c_ok[None, :]
        tl.store(out_ptr + (b * T + t[:, None]) * C + c[None, :], y.to(out_ptr.dtype.element_ty), mask=ok)
        if KEEP:
            if pid_t == 0:
                _store_kept(x_cols, col, c, c_ok, b, T, p_ptr, m_ptr, last_ptr, k_ptr, s_xt, s_xc, s_pb, s_pw, s_mb,
                            s_mt, C, W, HAS_PREV, MASKED, BLOCK_C)

    @triton.jit
    def _store_kept(x_cols, col, c, c_ok, b, T, p_ptr, m_ptr, last_ptr, k_ptr, s_xt, s_xc, s_pb, s_pw, s_mb, s_mt, C,
                    W: tl.constexpr, HAS_PREV: tl.constexpr, MASKED: tl.constexpr, BLOCK_C: tl.constexpr):
        """The ``W - 1`` inputs to keep for channels ``c`` (read at ``x_cols + col * s_xc`` of a row): those that end
        at the row's last real token. A function of its own because, inside the caller's runtime ``if``, Triton's
        compiler rejects names that the tap loop left with other types (the interpreter does not check it)."""
        end = T
        if MASKED:
            end = tl.load(last_ptr + b)
        for i in tl.static_range(W - 1):
            src = tl.zeros([BLOCK_C], dtype=tl.int64) + (end - (W - 1) + i)  # the input kept in slot i
            v = tl.load(x_cols + src * s_xt + col * s_xc, mask=c_ok & (src >= 0), other=0.0)
            if MASKED:
                m = tl.load(m_ptr + b * s_mb + src * s_mt, mask=c_ok & (src >= 0), other=0)
                v = v * m.to(v.dtype)
            if HAS_PREV:
                before = tl.load(p_ptr + b * s_pb + (W - 1 + src) * s_pw + c, mask=c_ok & (src < 0), other=0.0)
                v = tl.where(src >= 0, v, before.to(v.dtype))
            tl.store(k_ptr + (b * (W - 1) + i) * C + c, v.to(k_ptr.dtype.element_ty), mask=c_ok)

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


def short_conv_triton(x: torch.Tensor, prev: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
                      activation: str | None, cols: torch.Tensor | None = None, keep: bool = True,
                      mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Twin of :func:`short_conv_reference`, one launch (with a ``mask`` and ``keep``, three more small ones for each
    row's last real token, :func:`last_real`). ``keep`` False: no kept inputs, None in their place. ``x`` and ``mask``
    may have any strides; the kept inputs' channels and the weight must be contiguous, ``cols`` int32."""
    _check_prompt(x, prev, weight, bias, activation, cols, mask)
    if (prev is not None and prev.stride(-1) != 1) or not weight.is_contiguous():
        raise ValueError("the kernel needs contiguous kept-input channels and a contiguous [C, W] weight")
    if cols is not None and cols.dtype != torch.int32:
        raise TypeError(f"cols must be int32; got {cols.dtype}")
    B, T = x.shape[:2]
    C, W = weight.shape
    out = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    kept = torch.empty(B, W - 1, C, dtype=x.dtype, device=x.device) if keep else None
    if B and T and C:
        block_c = min(128, next_power_of_2(C))
        block_t = min(32, next_power_of_2(T))
        last = last_real(mask) if mask is not None and keep else None
        launch_kernel(_short_conv_kernel, (B, cdiv(T, block_t), cdiv(C, block_c)),
            x, cols if cols is not None else x, prev if prev is not None else x, mask if mask is not None else x,
            last if last is not None else x, weight, bias if bias is not None else weight, out,
            kept if keep else out, T, C, *x.stride(), prev.stride(0) if prev is not None else 0,
            prev.stride(1) if prev is not None else 0, *(mask.stride() if mask is not None else (0, 0)), W=W,
            GATHER=cols is not None, HAS_PREV=prev is not None, MASKED=mask is not None, HAS_BIAS=bias is not None,
            SILU=activation is not None, KEEP=keep, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=4)
    elif keep and T == 0:  # nothing new: the kept inputs stay
        kept.copy_(prev if prev is not None else torch.zeros_like(kept))
    return out, kept
