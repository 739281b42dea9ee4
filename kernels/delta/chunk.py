"""Triton kernel: chunked gated-delta-rule prefill (Gated DeltaNet, Qwen3-Next) with the state in a format.

One program owns one (sequence, value head, V block) and walks its sequence in chunks of ``BT``
(16, 32 or 64) tokens with the ``[K, V]`` state in float32 registers, as the GLA prefill
(:mod:`laquant.kernels.gla.chunk`) does. Per chunk, with ``G`` the cumulative log-decay
inside it (a scalar per head and token) and ``D_ij = exp(G_i - G_j)`` for ``j <= i``:

* the delta updates inside the chunk are one unit-lower-triangular system
  ``(I + A)``, ``A_ij = beta_i (k_i . k_j) D_ij`` for ``j < i``. Its inverse is built row by row
  (forward substitution on the ``[BT, BT]`` tile in registers), then
  ``u = (I + A)^-1 (beta v)`` and ``w = (I + A)^-1 (beta exp(G) k)`` (the WY form);
* ``v_new = u - w S`` are the values actually written; ``o = (q exp(G)) S + (q k^T * D) v_new``;
* ``S = exp(G_last) S + (k exp(G_last - G))^T v_new``, passed through its storage format every 64
  tokens when a ``roundtrip`` is given (as the reference does), and written out at the end.

The inverse and ``w`` depend only on k, g and beta, so with V split over several programs each
recomputes them: cheap next to the ``[BT, K] x [K, BV]`` products. The spec is
:func:`chunk_delta_reference` (laquant's :func:`~laquant.kernels.chunk_gated_delta_rule` per
sequence, with the formats of :class:`~laquant.kernels.common.state.StateQuantizer`). Matmuls take bf16
operands with float32 accumulation for bf16 inputs (as fla does), exact float32 for float32 inputs;
the triangular solve is always float32.

With a log-decay per key channel (Kimi Delta Attention, :mod:`laquant.kernels.kda.chunk`), ``G``
is ``[BT, K]`` and ``D`` a ``[BT, BT, K]`` product, built over slices of the channels (``exp(G_i - G_j)``
exact for ``j <= i``, never overflowing). That work depends only on the chunk's own tokens, so a first
kernel (:func:`~laquant.kernels.kda.chunk.kda_intra_chunk`) runs it for every chunk in parallel and
writes each token's row of the masked ``q k^T * D`` and its ``w`` and ``u``; this kernel then walks
the chunks with those (``PER_CHANNEL``), the decays applied per channel.

Where few long sequences leave most SMs idle, the chunk-local work runs instead as its own chunk-parallel launch
(:func:`~laquant.kernels.delta.intra.delta_intra_chunk`, fla's split) and the walk reads it in 64-token steps
(``INTRA``), a quarter of the serial steps: 2.0-2.3x at 1 x 2K-64K tokens on an H200, slower from 4 sequences of 16K
on, where the walks fill the GPU and the split's extra memory traffic costs more (:func:`splits_intra`;
``eval/results/split_intra_h200/``).
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.sizes import cdiv, next_power_of_2, sm_count
from ..common.state import State, StateQuantizer
from ..common.state_io import CHUNK, check_state_args, sequence_bounds, state_io, store_position, store_states
from .intra import chunk_warps, delta_intra_chunk
from .reference import chunk_gated_delta_rule

try:
    import triton
    import triton.language as tl

    from ..common.triton_numerics import (absmax_row_scale, chunk_rows, mm, program_tile, roundtrip_state, start_state,
                                          state_random_bytes, store_state_rows, tile_row, unit_lower_inverse)
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def chunk_delta_reference(q, k, v, g, beta, scale=None, initial_state: State | None = None,
                          output_final_state: bool = False, final_format: str = "fp32",
                          roundtrip: StateQuantizer | None = None, cu_seqlens: torch.Tensor | None = None,
                          use_qk_l2norm: bool = False, rounding: str = "nearest", seed: int = 0,
                          position: int | None = None):
    """What :func:`chunk_delta_triton` computes, in PyTorch; same arguments and returns."""
    return per_sequence_reference(chunk_gated_delta_rule, q, k, v, g, beta, scale, initial_state, output_final_state,
                                  final_format, roundtrip, cu_seqlens, use_qk_l2norm, rounding, seed, position)


def per_sequence_reference(rule, q, k, v, g, beta, scale, initial_state, output_final_state, final_format, roundtrip,
                           cu_seqlens, use_qk_l2norm, rounding: str = "nearest", seed: int = 0,
                           position: int | None = None):
    """A chunked reference ``rule`` (:func:`chunk_gated_delta_rule`, KDA's ``chunk_kda``) run per
    sequence, with the state formats in, inside and out as the chunk kernel has them."""
    position = store_position(initial_state, position)
    h0 = initial_state.load() if initial_state is not None else None
    outs, finals = [], []
    for n, (bos, eos) in enumerate(sequence_bounds(q, cu_seqlens)):
        rt = roundtrip.chunk_roundtrip(seed, torch.tensor([n], device=q.device), position) \
            if roundtrip is not None else None
        b = 0 if cu_seqlens is not None else n
        seg = lambda x: x[b:b + 1, bos:eos]  # noqa: E731
        o, state = rule(seg(q), seg(k), seg(v), seg(g), seg(beta), scale,
                        initial_state=h0[n:n + 1] if h0 is not None else None, output_final_state=True,
                        use_qk_l2norm=use_qk_l2norm, chunk_size=CHUNK, state_roundtrip=rt)
        outs.append(o)
        finals.append(state)
    o = torch.cat(outs, 1) if cu_seqlens is not None else torch.cat(outs, 0)
    return o, (store_states(torch.cat(finals), final_format, rounding, seed, position) if output_final_state else None)


if triton is not None:

    @triton.jit
    def _chunk_delta_fwd_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, cu_ptr, qk_ptr, w_ptr, u_ptr,
        s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_gk, s_bb, s_bt, s_bh,
        s_ob, s_ot, s_oh,
        T, qk_scale,
        H: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
        BK: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr, RT_EVERY: tl.constexpr,
        LOW_PRECISION: tl.constexpr, L2NORM: tl.constexpr, PER_CHANNEL: tl.constexpr, INTRA: tl.constexpr,
        # the state's formats in, inside and out (see laquant.kernels.common.state_io)
        h0_ptr, h0s_ptr, ht_ptr, hts_ptr, static_ptr,
        HAS_H0: tl.constexpr, IN_FMT: tl.constexpr, STORE_HT: tl.constexpr, OUT_FMT: tl.constexpr,
        QMAX_OUT: tl.constexpr, RT_FMT: tl.constexpr, RT_STATIC: tl.constexpr, QMAX_RT: tl.constexpr,
        seed, position, RT_SR: tl.constexpr, OUT_SR: tl.constexpr,
    ):
        n, h, i_v, bos, eos, b, offs_k, offs_v, mk, mv, mkv = program_tile(cu_ptr, T, H, K, V, BK, BV, VARLEN)
        S, static, state_off, scale_off = start_state(h0_ptr, h0s_ptr, static_ptr, n, h, offs_k, offs_v, mk, mkv, H, K,
                                                      V, HAS_H0, IN_FMT, RT_STATIC, BK, BV)
        hk = h // GROUP
        rows = tl.arange(0, BT)
        causal = rows[:, None] >= rows[None, :]
        q_base = q_ptr + b * s_qb + hk * s_qh
        k_base = k_ptr + b * s_kb + hk * s_kh
        v_base = v_ptr + b * s_vb + h * s_vh
        o_base = o_ptr + b * s_ob + h * s_oh

        for i_c in range(0, tl.cdiv(eos - bos, BT)):
            t0, offs_t, mt, mtk = chunk_rows(bos, eos, i_c, rows, mk, BT)
            mtv = mt[:, None] & mv[None, :]
            q = tl.load(q_base + offs_t[:, None] * s_qt + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
            k = tl.load(k_base + offs_t[:, None] * s_kt + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
            if L2NORM:  # as fla and transformers: x * rsqrt(sum(x^2) + 1e-6); padded rows stay 0
                q = q * tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None]
                k = k * tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
            q = q * qk_scale
            if PER_CHANNEL:  # KDA: G [BT, BK]
                G = tl.cumsum(tl.load(g_ptr + b * s_gb + h * s_gh + offs_t[:, None] * s_gt + offs_k[None, :] * s_gk,
                                      mask=mtk, other=0.0).to(tl.float32), axis=0)
                G_last = tile_row(G, rows, BT - 1)  # [BK]; padded rows have g = 0
                decay_in = tl.exp(G)  # [BT, BK]: from the chunk's start to each row
                decay_out = tl.exp(G_last[None, :] - G)  # from each row to the chunk's end
                decay_chunk = tl.exp(G_last)[:, None]
            else:  # a scalar log-decay per head: G [BT]
                g = tl.load(g_ptr + b * s_gb + h * s_gh + offs_t * s_gt, mask=mt, other=0.0).to(tl.float32)
                G = tl.cumsum(g, axis=0)
                G_last = tl.sum(tl.where(rows == BT - 1, G, 0.0), axis=0)  # padded rows have g = 0
                decay_in = tl.exp(G)[:, None]
                decay_out = tl.exp(G_last - G)[:, None]
                decay_chunk = tl.exp(G_last)
            if INTRA:  # q k^T * D, w and u from an intra-chunk launch (0 on padded rows)
                tok = (b * T + offs_t).to(tl.int64) * H + h  # the token's row of the intra-chunk outputs
                QK = tl.load(qk_ptr + tok[:, None] * BT + rows[None, :], mask=mt[:, None], other=0.0)
                w = tl.load(w_ptr + tok[:, None] * K + offs_k[None, :], mask=mtk, other=0.0)
                u = tl.load(u_ptr + tok[:, None] * V + offs_v[None, :], mask=mtv, other=0.0).to(tl.float32)
            else:  # built here, exp(G_i - G_j) as one [BT, BT] tile
                v = tl.load(v_base + offs_t[:, None] * s_vt + offs_v[None, :], mask=mtv, other=0.0).to(tl.float32)
                beta = tl.load(beta_ptr + b * s_bb + h * s_bh + offs_t * s_bt, mask=mt, other=0.0).to(tl.float32)
                D = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))
                A = tl.where(rows[:, None] > rows[None, :], mm(k, tl.trans(k), LOW_PRECISION) * D * beta[:, None], 0.0)
                QK = tl.where(causal, mm(q, tl.trans(k), LOW_PRECISION) * D, 0.0)
                inv = unit_lower_inverse(A, rows, BT, LOW_PRECISION)
                u = mm(inv, v * beta[:, None], LOW_PRECISION)
                w = mm(inv, k * beta[:, None] * decay_in, LOW_PRECISION)
            v_new = u - mm(w, S, LOW_PRECISION)
            o = mm(q * decay_in, S, LOW_PRECISION) + mm(QK, v_new, LOW_PRECISION)
            tl.store(o_base + offs_t[:, None] * s_ot + offs_v[None, :], o.to(o_ptr.dtype.element_ty), mask=mtv)
            S = S * decay_chunk + mm(tl.trans(k * decay_out), v_new, LOW_PRECISION)
            if RT_FMT > 0:
                if ((i_c + 1) % RT_EVERY == 0) & (t0 + BT < eos):
                    rbits = 0
                    if RT_SR:
                        rbits = state_random_bytes(seed, n, position, (i_c + 1) // RT_EVERY, h, offs_k, i_v * BV, K, V,
                                                   BK, BV)
                    S = roundtrip_state(S, static, RT_FMT, RT_STATIC, QMAX_RT, RT_SR, rbits)
        if STORE_HT:
            rbits = 0
            if OUT_SR:
                rbits = state_random_bytes(seed, n, position, 0, h, offs_k, i_v * BV, K, V, BK, BV)
            store_state_rows(S, ht_ptr + state_off, hts_ptr + scale_off, mk, mkv, absmax_row_scale(S, QMAX_OUT), OUT_FMT,
                             OUT_SR, rbits)


def chunk_delta_triton(q, k, v, g, beta, scale: float | None = None, initial_state: State | None = None,
                       output_final_state: bool = False, final_format: str = "fp32",
                       roundtrip: StateQuantizer | None = None, cu_seqlens: torch.Tensor | None = None,
                       use_qk_l2norm: bool = False, block_t: int | None = None, block_v: int | None = None,
                       num_warps: int | None = None, num_stages: int | None = None, out: torch.Tensor | None = None,
                       rounding: str = "nearest", seed: int = 0, position: int | None = None,
                       split_intra: bool | None = None):
    """Chunked gated-delta-rule forward. q, k ``[B, T, Hk, K]``, v ``[B, T, Hv, V]`` (``Hv`` a
    multiple of ``Hk``), g (log-decay) and beta ``[B, T, Hv]``. With ``cu_seqlens`` (int32
    ``[N + 1]``), B is 1 and the N sequences lie back to back along T, as in fla.

    ``initial_state``: :class:`State` ``[N, Hv, K, V]`` in fp32, bf16, fp8_row or int8_row.
    ``roundtrip``: the state's storage format inside the prefill (a :class:`StateQuantizer`),
    applied every 64 tokens. ``final_format``: the final state's format (fresh per-row scales).
    ``use_qk_l2norm`` normalises q and k in the kernel (Qwen3-Next does). ``split_intra``: the chunk-local
    work (the WY form, ``q k^T * D``) in its own launch for all chunks at once
    (:func:`~laquant.kernels.delta.intra.delta_intra_chunk`), the walk then taking ``block_t`` 64 by default;
    else built in the walk (``block_t`` 16 by default); :func:`splits_intra` chooses by default. ``block_t``
    (16, 32 or 64), ``block_v``, ``num_warps`` (4 by default, see :func:`~laquant.kernels.delta.intra.chunk_warps`)
    and ``num_stages`` (:data:`WALK_STAGES` by default) are launch parameters; they do not change the result beyond
    rounding. ``rounding``, ``seed`` and ``position``: the final state's (and a stochastic ``roundtrip``'s)
    stochastic rounding, as in :func:`~laquant.kernels.gla.chunk.chunk_gla_triton`.
    By default V is split over several programs (down to 32 columns)
    while the ``N * Hv`` sequence-heads alone cannot fill the GPU, unless a per-row state format
    needs whole rows. Returns ``(o, final_state or None)``.
    """
    if triton is None:
        raise RuntimeError("Triton is not installed; use chunk_delta_reference")
    B, T, Hk, K = q.shape
    H = v.shape[2]
    if (k.shape != q.shape or v.shape[:2] != q.shape[:2] or H % Hk or g.shape != v.shape[:3]
            or beta.shape != v.shape[:3]):
        raise ValueError(f"expected q, k [B, T, Hk, K], v [B, T, Hv, V] with Hv a multiple of Hk, g and beta "
                         f"[B, T, Hv]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if split_intra is None:
        split_intra = splits_intra(q, N * H, B * T)
    if not split_intra:
        return launch_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, final_format, roundtrip,
                            cu_seqlens, use_qk_l2norm, block_t or 16, block_v, num_warps, num_stages, out, rounding,
                            seed, position)
    return launch_with_intra(delta_intra_chunk, q, k, v, g, beta, scale, initial_state, output_final_state,
                             final_format, roundtrip, cu_seqlens, use_qk_l2norm, block_t or SPLIT_BLOCK_T, block_v,
                             num_warps, num_stages, out, rounding, seed, position)


# The chunk-parallel intra-chunk launch and a 64-token walk, chosen where the (sequence, head) programs are too few to
# fill the GPU (H200, 32 heads of 128, bf16: 2.0-2.4x the one-launch walk at 1 x 2K-64K and 1.8x at 2 x 16K, 0.85x at
# 1 x 1K, 0.96-1.04x at 4 x 16K, slower from 8 sequences of 8K on; eval/results/split_intra_h200/).
SPLIT_BLOCK_T = 64
SPLIT_SMS_PER_HEAD = 2
SPLIT_MIN_TOKENS = 2048


def splits_intra(q: torch.Tensor, sequence_heads: int, tokens: int) -> bool:
    """Whether :func:`chunk_delta_triton` runs the intra-chunk work in its own launch by default: on CUDA, for at
    most one (sequence, head) pair per :data:`SPLIT_SMS_PER_HEAD` SMs and at least :data:`SPLIT_MIN_TOKENS` tokens.
    Many sequences fill the GPU with walks whose 16-token steps build their own WY form; few long ones leave it
    waiting on the walk's serial steps, which the split cuts to a quarter."""
    if not q.is_cuda:
        return False
    sms = sm_count(q.device)
    return sequence_heads * SPLIT_SMS_PER_HEAD <= sms and tokens >= SPLIT_MIN_TOKENS


def check_launch(B: int, cu_seqlens, block_t: int) -> None:
    """Name a batch that cannot be packed or a chunk size the kernels do not take."""
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 (sequences packed along T); got B={B}")
    if block_t not in (16, 32, 64):
        raise ValueError(f"block_t must be 16, 32 or 64; got {block_t}")


# Pipeline stages of the walk by chunk size: two stages load the next chunk during this one's products (H200, bf16, 32
# heads of 128: at 16 tokens the delta rule 6-19% faster, KDA 4-6%, at 64 x 1K, 4 x 16K, 1 x 64K and 1 x 4K tokens, the
# same outputs bit for bit, eval/results/walk_stages_h200/; the split walk of 32 / 64 tokens 3-19% faster at 1 x 64K,
# eval/results/split_intra_h200/).
WALK_STAGES = {16: 2, 32: 2, 64: 2}


def launch_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, final_format, roundtrip, cu_seqlens,
                 use_qk_l2norm, block_t, block_v, num_warps, num_stages, out, rounding="nearest", seed=0, position=None,
                 intra=None):
    """The chunk kernel on shape-checked arguments; g ``[B, T, Hv]`` (per head) or ``[B, T, Hv, K]``
    (per channel, KDA's, which needs ``intra``); ``intra``: an intra-chunk launch's ``(qk, w, u)`` at the same
    ``block_t`` (:func:`~laquant.kernels.kda.chunk.kda_intra_chunk`,
    :func:`~laquant.kernels.delta.intra.delta_intra_chunk`), else the walk builds them: the gated delta rule's
    and KDA's prefill share it."""
    B, T, Hk, K = q.shape
    H, V = v.shape[2], v.shape[3]
    check_launch(B, cu_seqlens, block_t)
    num_stages = WALK_STAGES.get(block_t, 1) if num_stages is None else num_stages
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if g.dim() == 4 and intra is None:
        raise ValueError("a per-channel decay needs the intra-chunk products (intra)")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    o = torch.empty_like(v) if out is None else out
    check_state_args(initial_state, final_format, (N, H, K, V), "[N, Hv, K, V]")
    final = State.empty((N, H, K, V), final_format, q.device) if output_final_state else None
    dummy = o
    state_args, needs_rows = state_io(initial_state, final, final_format, roundtrip, H, K, dummy, rounding, seed,
                                      store_position(initial_state, position))
    BK, BV = next_power_of_2(K), next_power_of_2(V)
    if not needs_rows:  # per-row scales need whole rows in one program
        if block_v is not None:
            BV = min(BV, block_v)
        elif q.is_cuda:  # too few (sequence, head) programs to fill the GPU: split V as well
            sms = sm_count(q.device)
            while N * H * cdiv(V, BV) < sms and BV > 32:
                BV //= 2
    launch_kernel(_chunk_delta_fwd_kernel, (N * H, cdiv(V, BV)),
        q, k, v, g, beta, o, cu_seqlens if cu_seqlens is not None else dummy, *(intra or (dummy,) * 3),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1), g.stride(2),
        g.stride(3) if g.dim() == 4 else 0,
        beta.stride(0), beta.stride(1), beta.stride(2), o.stride(0), o.stride(1), o.stride(2),
        T, K ** -0.5 if scale is None else scale,
        H=H, GROUP=H // Hk, K=K, V=V, BT=block_t, BK=BK, BV=BV, VARLEN=cu_seqlens is not None,
        RT_EVERY=CHUNK // block_t, LOW_PRECISION=q.dtype != torch.float32, L2NORM=use_qk_l2norm,
        PER_CHANNEL=g.dim() == 4, INTRA=intra is not None,
        num_warps=chunk_warps(block_t, K, q.dtype != torch.float32, 4, wy_in_walk=intra is None,
                              per_channel=g.dim() == 4) if num_warps is None else num_warps,
        num_stages=num_stages, **state_args,
    )
    return o, final


INTRA_BUDGET_BYTES = 1 << 30  # an intra-chunk launch's outputs: a longer prompt runs in pieces


def piece_tokens(q, v, block_t: int) -> int:
    """Tokens per piece such that an intra-chunk launch's outputs stay within :data:`INTRA_BUDGET_BYTES`
    (a multiple of 64, at least 64)."""
    B, _, _, K = q.shape
    H, V = v.shape[2], v.shape[3]
    per_token = B * H * (block_t + K + V) * (4 if q.dtype == torch.float32 else 2)
    return max(CHUNK, INTRA_BUDGET_BYTES // per_token // CHUNK * CHUNK)


def launch_with_intra(intra_fn, q, k, v, g, beta, scale, initial_state, output_final_state, final_format, roundtrip,
                      cu_seqlens, use_qk_l2norm, block_t, block_v, num_warps, num_stages, out, rounding, seed,
                      position):
    """The prefill as ``intra_fn`` (an intra-chunk launch: ``(q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm,
    block_t) -> (qk, w, u)``) then the walk. A prompt whose intra-chunk outputs would pass
    :data:`INTRA_BUDGET_BYTES` runs in pieces of :func:`piece_tokens` (a multiple of the 64-token chunks; not with
    ``cu_seqlens`` or a ``roundtrip``): the state carried in float32 from one to the next, as inside one launch;
    only the last piece stores the final state (keyed by the store count the whole prefill would use). Same
    results as one launch up to float32 rounding."""
    check_launch(q.shape[0], cu_seqlens, block_t)  # before the intra-chunk launch
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    T = q.shape[1]
    piece = piece_tokens(q, v, block_t)
    if piece >= T or cu_seqlens is not None or roundtrip is not None:
        intra = intra_fn(q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm, block_t)
        return launch_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, final_format, roundtrip,
                            cu_seqlens, use_qk_l2norm, block_t, block_v, num_warps, num_stages, out, rounding, seed,
                            position, intra=intra)
    o = torch.empty_like(v) if out is None else out
    position = store_position(initial_state, position)
    state, final = initial_state, None
    for a in range(0, T, piece):
        b = min(T, a + piece)
        last = b == T
        part = [x[:, a:b] for x in (q, k, v, g, beta)]
        intra = intra_fn(*part, scale, None, use_qk_l2norm, block_t)
        _, final = launch_chunk(*part, scale, state, output_final_state or not last,
                                final_format if last else "fp32", None, None, use_qk_l2norm, block_t, block_v,
                                num_warps, num_stages, o[:, a:b], rounding if last else "nearest", seed, position,
                                intra=intra)
        state = final
    return o, final
