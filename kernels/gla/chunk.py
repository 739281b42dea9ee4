"""Triton kernel: chunked GLA prefill with the recurrent state kept in a storage format.

One program owns one (sequence, head, V block) and walks its sequence in chunks of ``BT``
(16, 32 or 64) tokens, the ``[K, V]`` state in float32 registers, so nothing but q, k, v, g in and o out (plus
the optional states) touches memory. Per chunk:

* inter-chunk: ``o = (q * exp(G)) @ S`` with ``G`` the cumulative log-decay inside the chunk;
* intra-chunk: exact causal attention. With a per-channel decay the ``exp(G_i - G_j)`` factor is
  split into a q side and a k side around a reference row in the middle of each 16-row column
  block: both factors stay within 8 tokens' decay (overflow would need a per-token log-decay
  below -11 in one channel; fla's GLA gates, ``logsigmoid / 16``, never get there). A scalar
  per-head decay (Lightning attention, Mamba2-style SSD) takes the exact ``[BT, BT]`` path;
* state: ``S = exp(G_last) S + (k * exp(G_last - G))^T v``; with ``roundtrip`` it passes through
  its storage format every 64 tokens (what a server keeping per-chunk state checkpoints sees), and on
  request it is also written out every ``checkpoint_every`` tokens and at the end, in a format.

The spec is :func:`chunk_gla_reference` (laquant's :func:`~laquant.kernels.chunk_gla` per
sequence, with the formats of :class:`~laquant.kernels.common.state.StateQuantizer`). Matmuls take bf16
operands with float32 accumulation for bf16 inputs (as fla does), exact float32 for float32 inputs, or
float32-accurate TF32 products on the tensor cores where the caller asks (``fp32_dots="tf32x3"``: Mamba2's scan).
"""

from __future__ import annotations

import torch

from ..common.formats import get_format
from ..common.launch import launch_kernel
from ..common.sizes import cdiv, next_power_of_2, sm_count
from ..common.state import State, StateQuantizer
from ..common.state_io import CHUNK, check_state_args, sequence_bounds, state_io, store_position, store_states
from ..common.store import store_states_triton
from .reference import chunk_gla

try:
    import triton
    import triton.language as tl

    from ..common.triton_numerics import (absmax_row_scale, chunk_rows, mm, program_tile, roundtrip_state, start_state,
                                          state_random_bytes, store_state_rows, tile_row)
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

SUB = 16  # rows per column block of the intra-chunk split
FP32_DOTS = ("ieee", "tf32x3")  # chunk_gla_triton's products of float32 inputs: exact, or on the tensor cores
MAX_STATE_TILE = 32768  # elements of a program's [BK, BV] state tile: V splits past it (rows in a row format: _store_after)


def chunk_gla_reference(q, k, v, g, scale=None, initial_state: State | None = None,
                        output_final_state: bool = False, final_format: str = "fp32",
                        roundtrip: StateQuantizer | None = None, checkpoint_every: int = 0,
                        cu_seqlens: torch.Tensor | None = None, rounding: str = "nearest", seed: int = 0,
                        position: int | None = None):
    """What :func:`chunk_gla_triton` computes, in PyTorch; same arguments and returns."""
    if g.dim() == 3:  # scalar per-head decay
        g = g.unsqueeze(-1).expand_as(q)
    bounds = sequence_bounds(q, cu_seqlens)
    position = store_position(initial_state, position)
    h0 = initial_state.load() if initial_state is not None else None
    outs, finals, ckpts = [], [], []
    for n, (bos, eos) in enumerate(bounds):
        b = 0 if cu_seqlens is not None else n
        slot = torch.tensor([n], device=q.device)
        rt = roundtrip.chunk_roundtrip(seed, slot, position) if roundtrip is not None else None
        state = h0[n:n + 1] if h0 is not None else None
        pieces, seq_ckpts = [], []
        step = checkpoint_every or max(eos - bos, 1)
        for t0 in range(bos, eos, step):
            t1 = min(t0 + step, eos)
            seg = lambda x: x[b:b + 1, t0:t1]
            o, state = chunk_gla(seg(q), seg(k), seg(v), seg(g), scale, state, True, state_roundtrip=rt)
            pieces.append(o)
            if checkpoint_every and t1 - t0 == checkpoint_every:
                seq_ckpts.append(state)
            if rt is not None and t1 < eos:
                state = rt(state)
        if state is None:
            state = torch.zeros(1, q.shape[2], q.shape[3], v.shape[3], device=q.device)
        outs.append(torch.cat(pieces, 1) if pieces else v.new_zeros(1, 0, *v.shape[2:]))
        finals.append(state)
        ckpts.append(seq_ckpts)
    o = torch.cat(outs, 1) if cu_seqlens is not None else torch.cat(outs, 0)
    final = store_states(torch.cat(finals), final_format, rounding, seed, position) if output_final_state else None
    ck = None
    if checkpoint_every:
        n_max = max(len(c) for c in ckpts)
        full = torch.zeros(len(bounds), n_max, *finals[0].shape[1:], device=q.device)
        for n, c in enumerate(ckpts):
            for i, s in enumerate(c):
                full[n, i] = s[0]
        ck = store_states(full, final_format, rounding, seed, position,
                          [(i + 1) * checkpoint_every // CHUNK for i in range(n_max)])
    return o, final, ck


if triton is not None:

    @triton.jit
    def _chunk_gla_fwd_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, o_ptr, ck_ptr, cks_ptr, cu_ptr,
        s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_ob, s_ot, s_oh,
        T, n_ckpt, qk_scale, decay_ptr,
        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
        BK: tl.constexpr, BV: tl.constexpr, SCALAR_DECAY: tl.constexpr, VARLEN: tl.constexpr,
        RT_EVERY: tl.constexpr, CKPT_EVERY: tl.constexpr, LOW_PRECISION: tl.constexpr, TF32X3: tl.constexpr,
        STORE_O: tl.constexpr, STORE_DECAY: tl.constexpr,
        # the state's formats in, inside and out (see state_io)
        h0_ptr, h0s_ptr, ht_ptr, hts_ptr, static_ptr,
        HAS_H0: tl.constexpr, IN_FMT: tl.constexpr, STORE_HT: tl.constexpr, OUT_FMT: tl.constexpr,
        QMAX_OUT: tl.constexpr, RT_FMT: tl.constexpr, RT_STATIC: tl.constexpr, QMAX_RT: tl.constexpr,
        seed, position, RT_SR: tl.constexpr, OUT_SR: tl.constexpr,
    ):
        n, h, i_v, bos, eos, b, offs_k, offs_v, mk, mv, mkv = program_tile(cu_ptr, T, H, K, V, BK, BV, VARLEN)
        rows = tl.arange(0, BT)
        sub = tl.arange(0, BC)
        q_base = q_ptr + b * s_qb + h * s_qh
        k_base = k_ptr + b * s_kb + h * s_kh
        v_base = v_ptr + b * s_vb + h * s_vh
        g_base = g_ptr + b * s_gb + h * s_gh
        o_base = o_ptr + b * s_ob + h * s_oh
        S, static, state_off, scale_off = start_state(h0_ptr, h0s_ptr, static_ptr, n, h, offs_k, offs_v, mk, mkv, H, K,
                                                      V, HAS_H0, IN_FMT, RT_STATIC, BK, BV)

        g_total = tl.zeros([BK], dtype=tl.float32)  # the sequence's summed log-decay (STORE_DECAY)
        for i_c in range(0, tl.cdiv(eos - bos, BT)):
            t0, offs_t, mt, mtk = chunk_rows(bos, eos, i_c, rows, mk, BT)
            if STORE_O:
                q = tl.load(q_base + offs_t[:, None] * s_qt + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
                q = q * qk_scale
            k = tl.load(k_base + offs_t[:, None] * s_kt + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
            v = tl.load(v_base + offs_t[:, None] * s_vt + offs_v[None, :], mask=mt[:, None] & mv[None, :],
                        other=0.0).to(tl.float32)
            if SCALAR_DECAY:
                G = tl.cumsum(tl.load(g_base + offs_t * s_gt, mask=mt, other=0.0).to(tl.float32), axis=0)
                if STORE_O:
                    o = mm(q * tl.exp(G)[:, None], S, LOW_PRECISION, TF32X3)
                    causal = rows[:, None] >= rows[None, :]
                    decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))
                    A = tl.where(causal, mm(q, tl.trans(k), LOW_PRECISION, TF32X3) * decay, 0.0)
                    o += mm(A, v, LOW_PRECISION, TF32X3)
                G_last = tl.sum(tl.where(rows == BT - 1, G, 0.0), axis=0)
                k_end = k * tl.exp(G_last - G)[:, None]
                S = S * tl.exp(G_last) + mm(tl.trans(k_end), v, LOW_PRECISION, TF32X3)
                g_total += G_last
            else:
                G = tl.cumsum(tl.load(g_base + offs_t[:, None] * s_gt + offs_k[None, :], mask=mtk,
                                      other=0.0).to(tl.float32), axis=0)
                if STORE_O:
                    o = mm(q * tl.exp(G), S, LOW_PRECISION, TF32X3)
                    for c in tl.static_range(BT // BC):
                        offs_c = t0 + c * BC + sub
                        mc = offs_c < eos
                        mck = mc[:, None] & mk[None, :]
                        kc = tl.load(k_base + offs_c[:, None] * s_kt + offs_k[None, :], mask=mck, other=0.0)
                        gc = tl.cumsum(tl.load(g_base + offs_c[:, None] * s_gt + offs_k[None, :], mask=mck,
                                               other=0.0).to(tl.float32), axis=0)
                        vc = tl.load(v_base + offs_c[:, None] * s_vt + offs_v[None, :], mask=mc[:, None] & mv[None, :],
                                     other=0.0).to(tl.float32)
                        # exp(G_i - G_j) = exp(G_i - G_ref) * exp(G_ref - G_j), G_ref the block's middle row
                        k_side = kc.to(tl.float32) * tl.exp(tile_row(gc, sub, BC // 2)[None, :] - gc)
                        g_ref = tile_row(G, rows, c * BC + BC // 2)
                        q_side = q * tl.exp(tl.where((rows >= c * BC)[:, None], G - g_ref[None, :], 0.0))
                        A = mm(q_side, tl.trans(k_side), LOW_PRECISION, TF32X3)
                        A = tl.where(rows[:, None] >= (c * BC + sub)[None, :], A, 0.0)
                        o += mm(A, vc, LOW_PRECISION, TF32X3)
                G_last = tile_row(G, rows, BT - 1)  # padded rows have g = 0, so this is the last real row's
                k_end = k * tl.exp(G_last[None, :] - G)
                S = S * tl.exp(G_last)[:, None] + mm(tl.trans(k_end), v, LOW_PRECISION, TF32X3)
                g_total += G_last
            if STORE_O:
                tl.store(o_base + offs_t[:, None] * s_ot + offs_v[None, :], o.to(o_ptr.dtype.element_ty),
                         mask=mt[:, None] & mv[None, :])
            if CKPT_EVERY > 0:
                if ((i_c + 1) % CKPT_EVERY == 0) & (t0 + BT <= eos):
                    c_idx = (i_c + 1) // CKPT_EVERY - 1
                    ck_off = ((n * n_ckpt + c_idx) * H + h).to(tl.int64) * K
                    rbits = 0
                    if OUT_SR:
                        rbits = state_random_bytes(seed, n, position, (i_c + 1) // RT_EVERY, h, offs_k, i_v * BV, K, V,
                                                   BK, BV)
                    store_state_rows(S, ck_ptr + ck_off * V + offs_k[:, None] * V + offs_v[None, :],
                                     cks_ptr + ck_off + offs_k, mk, mkv, absmax_row_scale(S, QMAX_OUT), OUT_FMT, OUT_SR,
                                     rbits)
            if RT_FMT > 0:
                if ((i_c + 1) % RT_EVERY == 0) & (t0 + BT < eos):
                    rbits = 0
                    if RT_SR:
                        rbits = state_random_bytes(seed, n, position, (i_c + 1) // RT_EVERY, h, offs_k, i_v * BV, K, V,
                                                   BK, BV)
                    S = roundtrip_state(S, static, RT_FMT, RT_STATIC, QMAX_RT, RT_SR, rbits)
        if STORE_DECAY:
            if i_v == 0:
                tl.store(decay_ptr + scale_off, g_total, mask=mk)
        if STORE_HT:
            rbits = 0
            if OUT_SR:
                rbits = state_random_bytes(seed, n, position, 0, h, offs_k, i_v * BV, K, V, BK, BV)
            store_state_rows(S, ht_ptr + state_off, hts_ptr + scale_off, mk, mkv, absmax_row_scale(S, QMAX_OUT), OUT_FMT,
                             OUT_SR, rbits)


    @triton.jit
    def _segment_scan_kernel(local_ptr, decay_ptr, h0_ptr, start_ptr, final_ptr, n_seg,
                             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                             BV: tl.constexpr, HAS_H0: tl.constexpr):
        """Each segment's initial state from its predecessors': ``S_j = exp(d_{j-1}) S_{j-1} + L_{j-1}``
        (``L`` a segment's final state from a zero start, ``d`` its summed log-decay)."""
        i_nh = tl.program_id(0)
        n = i_nh // H
        h = i_nh % H
        offs_k = tl.program_id(1) * BK + tl.arange(0, BK)
        offs_v = tl.arange(0, BV)
        mk = offs_k < K
        mkv = mk[:, None] & (offs_v < V)[None, :]
        tile = offs_k[:, None] * V + offs_v[None, :]
        S = tl.zeros([BK, BV], dtype=tl.float32)
        if HAS_H0:
            S = tl.load(h0_ptr + (n * H + h).to(tl.int64) * K * V + tile, mask=mkv, other=0.0)
        for j in range(0, n_seg):
            seg = ((n * n_seg + j) * H + h).to(tl.int64)
            tl.store(start_ptr + seg * K * V + tile, S, mask=mkv)
            d = tl.load(decay_ptr + seg * K + offs_k, mask=mk, other=0.0)
            S = S * tl.exp(d)[:, None] + tl.load(local_ptr + seg * K * V + tile, mask=mkv, other=0.0)
        tl.store(final_ptr + (n * H + h).to(tl.int64) * K * V + tile, S, mask=mkv)


def chunk_gla_triton(q, k, v, g, scale: float | None = None, initial_state: State | None = None,
                     output_final_state: bool = False, final_format: str = "fp32",
                     roundtrip: StateQuantizer | None = None, checkpoint_every: int = 0,
                     cu_seqlens: torch.Tensor | None = None, block_t: int = 16, block_v: int | None = None,
                     num_warps: int = 4, num_stages: int = 1, segments: int | None = None,
                     out: torch.Tensor | None = None, rounding: str = "nearest", seed: int = 0,
                     position: int | None = None, fp32_dots: str = "ieee"):
    """Chunked GLA forward. q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, g the log-decay, ``[B, T, H, K]``
    per channel or ``[B, T, H]`` per head. With ``cu_seqlens`` (int32 ``[N + 1]``), B is 1 and the
    N sequences lie back to back along T, as in fla.

    ``initial_state``: :class:`State` ``[N, H, K, V]`` in fp32, bf16, fp8_row or int8_row.
    ``roundtrip``: the state's storage format inside the prefill (a :class:`StateQuantizer`: its
    format, and static scales if its ``renorm_interval`` is 0), applied every 64 tokens.
    ``final_format`` is the format of the final state and the checkpoints (fresh per-row scales).
    ``block_t`` (16, 32 or 64 tokens per step of the kernel), ``block_v``, ``num_warps`` and
    ``num_stages`` are launch parameters; they do not change the result beyond rounding.
    ``segments``: split each sequence into this many pieces run in parallel (default: enough to
    fill the GPU when ``B * H`` programs cannot). Not with round trips through a storage format
    (sequential by nature). With ``checkpoint_every`` the pieces are ``checkpoint_every`` tokens long
    (any ``segments > 1``; by default where ``B * H`` programs cannot fill the GPU), and the
    checkpoints are their chained start states, stored by
    :func:`~laquant.kernels.common.store.store_states_triton` (the same codes as the kernel's own stores
    up to the float32 order of the scan).
    ``fp32_dots``: float32 inputs' products, exact (``ieee``, on the CUDA cores) or float32-accurate on the
    tensor cores (``tf32x3``: several times faster, a few ulps apart); bf16 inputs take bf16 products.
    ``rounding`` (nearest or stochastic) rounds the final state and the checkpoints; a stochastic
    ``roundtrip`` quantizer rounds the round trips so. Their random bits are keyed by ``seed``,
    the sequence, ``position`` (default: the store after ``initial_state``'s) and the 64-token
    chunk (:func:`~laquant.kernels.common.state.state_random_bytes`).
    Returns ``(o, final_state or None, checkpoints or None)``; checkpoint ``c`` of a sequence is
    its state after ``(c + 1) * checkpoint_every`` tokens (zeros past its end).
    """
    if triton is None:
        raise RuntimeError("Triton is not installed; use chunk_gla_reference")
    B, T, H, K = q.shape
    V = v.shape[-1]
    scalar = g.dim() == 3
    if k.shape != q.shape or v.shape[:3] != q.shape[:3] or g.shape[:3] != q.shape[:3] or (not scalar and g.shape != q.shape):
        raise ValueError(f"expected q, k [B, T, H, K], v [B, T, H, V], g [B, T, H(, K)]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}")
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 (sequences packed along T); got B={B}")
    if block_t not in (16, 32, 64):
        raise ValueError(f"block_t must be 16, 32 or 64; got {block_t}")
    if checkpoint_every % CHUNK:
        raise ValueError(f"checkpoint_every must be a multiple of {CHUNK} tokens; got {checkpoint_every}")
    if fp32_dots not in FP32_DOTS:
        raise ValueError(f"fp32_dots must be one of {', '.join(FP32_DOTS)}; got {fp32_dots!r}")
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    q, k, v, g = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, g))
    o = torch.empty_like(v) if out is None else out
    check_state_args(initial_state, final_format, (N, H, K, V), "[N, H, K, V]")
    sequential_state = roundtrip is not None and not roundtrip.is_plain_fp32
    rng = dict(rounding=rounding, seed=seed, position=store_position(initial_state, position))
    launch = dict(block_t=block_t, block_v=block_v, num_warps=num_warps, num_stages=num_stages, fp32_dots=fp32_dots)
    if segments is None:
        sms = sm_count(q.device)
        # below one program per SM, split; the split costs a state-only pass over k, v, g
        if cu_seqlens is not None or sequential_state or N * H >= sms:
            segments = 1
        elif checkpoint_every:  # the pieces' start states are the checkpoints
            segments = cdiv(T, checkpoint_every)
        else:
            segments = min(cdiv(2 * sms, N * H), cdiv(T, 4 * CHUNK))
    if segments > 1:
        if sequential_state or cu_seqlens is not None:
            raise ValueError("segments > 1 needs float32 states (no round trips) and no cu_seqlens")
        return _segmented(q, k, v, g, scale, initial_state, output_final_state, final_format, segments, o, launch,
                          rng, checkpoint_every)
    if (get_format(final_format).is_scaled and (output_final_state or checkpoint_every)
            and _state_tile(K, V) > MAX_STATE_TILE):
        return _store_after(q, k, v, g, scale, initial_state, output_final_state, final_format, roundtrip,
                            checkpoint_every, cu_seqlens, o, rng, launch)
    final = State.empty((N, H, K, V), final_format, q.device) if output_final_state else None
    longest = T if cu_seqlens is None else int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item())
    n_ckpt = longest // checkpoint_every if checkpoint_every else 0
    ckpt = State.empty((N, n_ckpt, H, K, V), final_format, q.device) if checkpoint_every else None
    if ckpt is not None:
        ckpt.data.zero_()
        if ckpt.scale is not None:
            ckpt.scale.fill_(1.0)
    _launch(q, k, v, g, o, scale, N, initial_state, final, ckpt if n_ckpt else None, checkpoint_every, roundtrip,
            cu_seqlens, store_o=True, decay=None, rng=rng, **launch)
    return o, final, ckpt


def _state_tile(K: int, V: int) -> int:
    return next_power_of_2(K) * next_power_of_2(V)


def _store_after(q, k, v, g, scale, initial_state, output_final_state, final_format, roundtrip, checkpoint_every,
                 cu_seqlens, o, rng, launch):
    """A head whose whole ``[K, V]`` rows (one scale each) do not fit one program: the kernel writes the
    final state and checkpoints in float32 with V split across programs, then they are stored in
    ``final_format`` by one more kernel (:func:`~laquant.kernels.common.store.store_states_triton`),
    keyed as the kernel's own stores; a checkpoint past its sequence's end stays zero with scale 1."""
    _, final, ckpt = chunk_gla_triton(q, k, v, g, scale, initial_state, output_final_state, "fp32", roundtrip,
                                      checkpoint_every, cu_seqlens, segments=1, out=o, seed=rng["seed"],
                                      position=rng["position"], **launch)
    store = lambda x, subs=None: store_states_triton(x, final_format, rng["rounding"], rng["seed"], rng["position"],  # noqa: E731
                                                     subs)
    if final is not None:
        final = store(final.data)
    if ckpt is not None:
        n_ckpt = ckpt.data.shape[1]
        ckpt = store(ckpt.data, [(c + 1) * checkpoint_every // CHUNK for c in range(n_ckpt)])
        if cu_seqlens is not None and n_ckpt:
            lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
            ends = torch.arange(1, n_ckpt + 1, device=lens.device) * checkpoint_every
            past = (ends[None, :] > lens[:, None])[:, :, None, None, None]
            ckpt.scale.masked_fill_(past, 1.0)
    return o, final, ckpt


_PIECE_BOUNDS: dict = {}  # (device, stream, B, T, length) -> the pieces' cu_seqlens


def _piece_bounds(B: int, T: int, length: int, device: torch.device) -> torch.Tensor:
    """The cu_seqlens (int32 ``[B * pieces + 1]``) of B sequences of T tokens cut into pieces of ``length``, made on
    the device (a copy from host memory would wait for the GPU) and kept per shape and stream: their eight small
    kernels and their host time ran in every layer of every prefill. Not kept when made inside a CUDA graph
    capture (the tensor would live in the graph's memory, its values only written by a replay)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
    key = (device, stream, B, T, length)
    cu = _PIECE_BOUNDS.get(key)
    if cu is None:
        piece = (torch.arange(cdiv(T, length), dtype=torch.int32, device=device) * length).clamp_max(T)
        starts = (torch.arange(B, dtype=torch.int32, device=device)[:, None] * T + piece).flatten()
        cu = torch.cat([starts, starts.new_full((1,), B * T)])
        if stream is None or not torch.cuda.is_current_stream_capturing():
            if len(_PIECE_BOUNDS) >= 64:
                _PIECE_BOUNDS.clear()
            _PIECE_BOUNDS[key] = cu
    return cu


def _segmented(q, k, v, g, scale, initial_state, output_final_state, final_format, segments, o, launch, rng,
               checkpoint_every: int = 0):
    """Sequence-parallel prefill: each sequence cut into ``segments`` pieces (of ``checkpoint_every``
    tokens when given). Pass 1 runs every piece from a zero state and keeps its final state and
    summed log-decay; a scan chains those into each piece's true initial state; pass 2 runs every
    piece from it, writing o. The checkpoints are the pieces' initial states (and the final one)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    length = checkpoint_every or CHUNK * cdiv(cdiv(T, segments), CHUNK)
    segments = cdiv(T, length)
    cu = _piece_bounds(B, T, length, q.device)
    flat = lambda x: x.reshape(1, B * T, *x.shape[2:])  # noqa: E731 - [B, T, ...] -> packed [1, B*T, ...]
    qf, kf, vf, gf, of = (flat(x) for x in (q, k, v, g, o))
    n_pieces = B * segments
    local = State(torch.empty(n_pieces, H, K, V, device=q.device), None, "fp32")
    decay = torch.empty(n_pieces, H, K, device=q.device)
    # the state-only pass has no intra-chunk work: long chunks mean fewer sequential steps
    _launch(qf, kf, vf, gf, of, scale, n_pieces, None, local, None, 0, None, cu, store_o=False, decay=decay,
            **{**launch, "block_t": 64, "block_v": None, "num_warps": 4})
    starts_state = torch.empty_like(local.data)
    final = torch.empty(B, H, K, V, device=q.device)
    h0 = initial_state.load().contiguous() if initial_state is not None else final
    BKs = min(32, next_power_of_2(K))
    launch_kernel(_segment_scan_kernel, (B * H, cdiv(K, BKs)),
        local.data, decay, h0, starts_state, final, segments, H=H, K=K,
        V=V, BK=BKs, BV=next_power_of_2(V),
        HAS_H0=initial_state is not None)
    _launch(qf, kf, vf, gf, of, scale, n_pieces, State(starts_state, None, "fp32"), None, None, 0, None, cu,
            store_o=True, decay=None, **launch)
    ckpt = None
    if checkpoint_every:  # checkpoint c: the state after (c + 1) * checkpoint_every tokens
        n_ckpt = T // checkpoint_every
        after = torch.cat([starts_state.view(B, segments, H, K, V)[:, 1:], final[:, None]], 1)[:, :n_ckpt]
        ckpt = store_states_triton(after.contiguous(), final_format, rng["rounding"], rng["seed"], rng["position"],
                                   [(c + 1) * checkpoint_every // CHUNK for c in range(n_ckpt)])
    return o, (store_states_triton(final, final_format, rng["rounding"], rng["seed"], rng["position"])
               if output_final_state else None), ckpt


def _launch(q, k, v, g, o, scale, N, initial_state, final, ckpt, checkpoint_every, roundtrip, cu_seqlens, store_o,
            decay, block_t, block_v, num_warps, num_stages, rng=None, fp32_dots="ieee"):
    B, T, H, K = q.shape
    V = v.shape[-1]
    final_format = final.format if final is not None else (ckpt.format if ckpt is not None else "fp32")
    dummy = o
    state_args, needs_rows = state_io(initial_state, final, final_format, roundtrip, H, K, dummy, **(rng or {}))
    BK, BV = next_power_of_2(K), next_power_of_2(V)
    if not needs_rows:  # per-row scales need whole rows in one program
        # a [BK, BV] state tile past 32K elements does not fit shared memory (K = 256, V = 512 asked
        # for 296 KiB on an H100); V splits across programs
        BV = min(BV, block_v or BV, max(16, MAX_STATE_TILE // BK))
    elif BK * BV > MAX_STATE_TILE:  # a final state or checkpoints in a row format took _store_after
        rt = roundtrip.format.name if roundtrip is not None else final_format
        raise ValueError(f"a round trip through {rt} with fresh per-row scales inside the prefill "
                         f"(prefill_roundtrip) needs a head's whole [K, V] = [{K}, {V}] state in one program, more "
                         f"than its {MAX_STATE_TILE} elements fit: use static scales (renorm_interval 0), or "
                         "prefill_roundtrip false")
    launch_kernel(_chunk_gla_fwd_kernel, (N * H, cdiv(V, BV)),
        q, k, v, g, o,
        ckpt.data if ckpt is not None else dummy, ckpt.scale if ckpt is not None and ckpt.scale is not None else dummy,
        cu_seqlens if cu_seqlens is not None else dummy,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1), g.stride(2), o.stride(0), o.stride(1),
        o.stride(2), T, ckpt.data.shape[1] if ckpt is not None else 1, K ** -0.5 if scale is None else scale,
        decay if decay is not None else dummy,
        H=H, K=K, V=V, BT=block_t, BC=SUB, BK=BK, BV=BV, SCALAR_DECAY=g.dim() == 3, VARLEN=cu_seqlens is not None,
        RT_EVERY=CHUNK // block_t, CKPT_EVERY=checkpoint_every // block_t if ckpt is not None else 0,
        LOW_PRECISION=q.dtype != torch.float32, TF32X3=fp32_dots == "tf32x3", STORE_O=store_o,
        STORE_DECAY=decay is not None,
        num_warps=num_warps, num_stages=num_stages, **state_args,
    )
