"""The Python side of the chunked kernels' state handling (GLA and the delta rule share it):
sequence bounds, the final states a reference stores, and the state-format launch arguments."""

from __future__ import annotations

import torch

from .formats import get_format, kernel_code
from .state import State, StateQuantizer, StoreKey, quantize_state

CHUNK = 64  # state round trips and checkpoints fall on multiples of this many tokens


def sequence_bounds(q: torch.Tensor, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int]]:
    """``(bos, eos)`` of every sequence: rows of the batch, or packed along T by ``cu_seqlens``."""
    if cu_seqlens is None:
        return [(0, q.shape[1])] * q.shape[0]
    cu = cu_seqlens.tolist()
    return list(zip(cu[:-1], cu[1:]))


def store_states(state: torch.Tensor, fmt: str, rounding: str = "nearest", seed: int = 0, position: int = 1,
                 checkpoint_subs: list[int] | None = None) -> State:
    """float32 states ``[N, H, K, V]`` stored in ``fmt`` with fresh scales (what a prefill returns),
    or checkpoints ``[N, C, H, K, V]`` (``checkpoint_subs``: the sub-store of each ``c``); stochastic
    rounding keys the bits of sequence ``n`` by ``(seed, n, position, sub)``. Its Triton twin is
    :func:`~.store.store_states_triton`."""
    if rounding == "nearest":
        return State(*quantize_state(state, fmt), fmt)
    quant = StateQuantizer(fmt, rounding=rounding)
    slots = torch.arange(state.shape[0], device=state.device)
    if checkpoint_subs is None:
        return State(*quant.store(state, key=StoreKey(seed, slots, position)), fmt)
    parts = [quant.store(state[:, c], key=StoreKey(seed, slots, position, sub)) for c, sub in enumerate(checkpoint_subs)]
    if not parts:
        return State(*quantize_state(state, fmt), fmt)
    return State(torch.stack([d for d, _ in parts], 1), torch.stack([s for _, s in parts], 1), fmt)


def store_position(initial_state: State | None, position: int | None) -> int:
    """The store count a prefill's stores are keyed by: given, or the one after ``initial_state``'s."""
    if position is not None:
        return position
    return (initial_state.n_stores if initial_state is not None else 0) + 1


def check_state_args(initial_state: State | None, final_format: str, shape: tuple, layout: str) -> None:
    """Name an unsupported format or a misshapen initial state before any work."""
    kernel_code(final_format)
    if initial_state is not None:
        if tuple(initial_state.data.shape) != shape:
            raise ValueError(f"initial_state must be {layout} = {shape}; got {tuple(initial_state.data.shape)}")
        kernel_code(initial_state.format)


def _qmax(fmt: str) -> float:
    spec = get_format(fmt)
    return spec.qmax if spec.is_scaled else 1.0


def state_io(initial_state: State | None, final: State | None, final_format: str,
             roundtrip: StateQuantizer | None, H: int, K: int, dummy: torch.Tensor, rounding: str = "nearest",
             seed: int = 0, position: int = 1) -> tuple[dict, bool]:
    """The state-format arguments both chunked kernels take: the initial state and its scales, the
    final state's buffers, the static scales of a round trip, and their format constexprs, with
    the stochastic rounding of the round trips (the round trip's quantizer) and of the final state
    and checkpoints (``rounding``), keyed by ``seed`` and ``position``. Also whether a program
    needs whole state rows (per-row scales computed in it)."""
    if rounding == "stochastic":
        StateQuantizer(final_format, rounding=rounding)  # a clear error for a format it does not apply to
    rt_code = kernel_code(roundtrip.format) if roundtrip is not None else 0
    rt_static = bool(roundtrip is not None and roundtrip.uses_static_scale)
    args = dict(
        h0_ptr=initial_state.data.contiguous() if initial_state is not None else dummy,
        h0s_ptr=initial_state.scale.contiguous() if initial_state is not None and initial_state.scale is not None
        else dummy,
        ht_ptr=final.data if final is not None else dummy,
        hts_ptr=final.scale if final is not None and final.scale is not None else dummy,
        static_ptr=roundtrip.static_scale.reshape(H, K).float().contiguous().to(dummy.device) if rt_static else dummy,
        HAS_H0=initial_state is not None, IN_FMT=kernel_code(initial_state.format) if initial_state is not None else 0,
        STORE_HT=final is not None, OUT_FMT=kernel_code(final_format), QMAX_OUT=_qmax(final_format),
        RT_FMT=rt_code, RT_STATIC=rt_static, QMAX_RT=_qmax(roundtrip.format.name) if roundtrip is not None else 1.0,
        seed=seed, position=position, RT_SR=bool(roundtrip is not None and roundtrip.stochastic),
        OUT_SR=rounding == "stochastic",
    )
    needs_rows = get_format(final_format).is_scaled or (roundtrip is not None and roundtrip.format.is_scaled
                                                        and not rt_static)
    return args, needs_rows


# (block_k, num_warps) of the decode kernels per format (GLA's; the delta rule's and KDA's): the fastest at
# the e2e models' shapes (`python tools/sweep_kernels.py state_decode --write`, stochastic rounding for the
# 8-bit formats).
# --- generated by tools/sweep_kernels.py state_decode: begin ---
# NVIDIA H200
DECODE_LAUNCH = {"fp32": (16, 1), "bf16": (16, 1), "fp8_row": (16, 1), "int8_row": (16, 1)}
DELTA_DECODE_LAUNCH = {"fp32": (128, 4), "bf16": (64, 2), "fp8_row": (16, 1), "int8_row": (16, 1)}
# --- generated by tools/sweep_kernels.py state_decode: end ---

# (block_k, num_warps) of the SSD (Mamba2) decode step where a batch makes at most SSD_FEW_PROGRAMS programs (one
# per sequence and head; Mamba2's 64 heads at B = 1): up to 128 state rows of a head in one block over four warps.
# On an H200 (`tools/sweep_ssd_decode.py`, N = 128 rows of P = 64) it takes 2.4 / 2.8 us (fp32 / int8 with
# stochastic rounding) against DECODE_LAUNCH's 4.2 / 8.0 us at B = 1; at B = 64 DECODE_LAUNCH's stays the fastest
# (eval/results/mamba2_decode_h200/run4_ssd_sweep/). The formats not swept take DECODE_LAUNCH's.
SSD_FEW_PROGRAMS = 64
SSD_FEW_PROGRAMS_LAUNCH = {"fp32": (128, 4), "int8_row": (128, 4)}

# (block_k, block_v, num_warps, prefetch) of the verify kernels per format (speculative decoding; GLA's, the
# delta rule's), for the verify step and for the commit (the same kernel storing the state instead of the
# outputs; a verify step keeping every token's state stores like a commit and takes the commit's entry):
# block_k None is the whole K (the delta rule sums k^T S over it in one block), block_v None the whole V
# (forced for the scaled formats, whose row scale spans the row); prefetch: the next token's inputs load
# during this token's arithmetic (more registers). The fastest at the e2e models' shapes, B = 64, 4 tokens
# (`python tools/sweep_kernels.py verify --write`, stochastic rounding for the 8-bit formats).
# --- generated by tools/sweep_kernels.py verify: begin ---
# NVIDIA H200
VERIFY_LAUNCH = {"fp32": (32, 32, 1, 1), "bf16": (32, 32, 1, 1),
                 "fp8_row": (8, None, 1, 1), "int8_row": (8, None, 1, 1)}
COMMIT_LAUNCH = {"fp32": (8, 64, 1, 0), "bf16": (32, 64, 2, 0),
                 "fp8_row": (32, None, 4, 1), "int8_row": (32, None, 4, 1)}
DELTA_VERIFY_LAUNCH = {"fp32": (None, 16, 2, 1), "bf16": (None, 8, 1, 1),
                       "fp8_row": (None, None, 8, 1), "int8_row": (None, None, 8, 0)}
DELTA_COMMIT_LAUNCH = {"fp32": (None, 32, 4, 1), "bf16": (None, 32, 4, 1),
                       "fp8_row": (None, None, 8, 1), "int8_row": (None, None, 8, 0)}
# --- generated by tools/sweep_kernels.py verify: end ---


def pool_args(state: torch.Tensor, scale: torch.Tensor | None, pool_idx: torch.Tensor,
              n_stores: torch.Tensor | None, quantizer: StateQuantizer, H: int, K: int,
              block_k: int | None, num_warps: int | None,
              launch: dict | None = None) -> tuple[tuple, tuple, dict, int]:
    """What both decode kernels take for a state pool ``state`` ``[P, H, K, V]`` (per-row ``scale``
    ``[P, H, K]``): its pointers (state, scales, slots, store counts, static scales), its strides,
    the format constexprs with ``BLOCK_K``, and ``num_warps`` (defaults: the kernel's ``launch`` table,
    :data:`DECODE_LAUNCH` unless given)."""
    fmt = quantizer.format
    code = kernel_code(fmt)
    if state.stride(-1) != 1 or (scale is not None and scale.stride(-1) != 1):
        raise ValueError("state and scale pools must be contiguous in their last dimension")
    if fmt.is_scaled and quantizer.renorm_interval > 1 and n_stores is None:
        raise ValueError("renorm_interval > 1 needs the per-slot store counts n_stores")
    if quantizer.stochastic and n_stores is None:
        raise ValueError("stochastic rounding needs the per-slot store counts n_stores (its random bits' counter)")
    default_k, default_warps = (launch or DECODE_LAUNCH)[fmt.name]
    scale_t = scale if scale is not None else state
    static = (quantizer.static_scale.reshape(H, K).float().contiguous().to(state.device)
              if quantizer.uses_static_scale else scale_t)
    ptrs = (state, scale_t, pool_idx, n_stores if n_stores is not None else pool_idx, static)
    strides = (state.stride(0), state.stride(1), state.stride(2), scale_t.stride(0),
               scale_t.stride(1) if scale is not None else 0)
    consts = dict(FMT=code, RENORM=quantizer.renorm_interval, QMAX=fmt.qmax if fmt.is_scaled else 1.0,
                  SR=quantizer.stochastic,
                  BLOCK_K=min(block_k or default_k, 1 << (K - 1).bit_length()))
    return ptrs, strides, consts, num_warps or default_warps
