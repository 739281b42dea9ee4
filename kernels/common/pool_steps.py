"""Several recurrent steps on a state pool at once, for speculative decoding's verify step: what the
GLA and delta-rule verify kernels (``gla/verify.py``, ``delta/verify.py``) share.

A verify step runs ``T`` tokens per sequence from its pool slot, storing the state after each
token exactly as ``T`` decode steps would store it (same format, scale rule, store count
``n_stores + 1 + t`` and so the same stochastic rounding bits) and loading it back for the next
token, but leaves the pool as it was. Accepting ``n`` of the tokens (per sequence) then writes the
state after the ``n``-th token into the slot, which leaves the pool bit-identical to ``n`` decode
steps: from the kept states (:func:`commit_kept`, when the verify step kept them, ``[B, T, H, K, V]``
in the state format) or by running the first ``n`` tokens again (the kernels' commit mode, no side
buffer). ``n_stores`` is read, never incremented: the caller counts, as for the decode kernels.

The verify step's outputs follow ``numerics`` (:data:`VERIFY_NUMERICS`): ``"decode"`` (the default) rounds
the state to its format after every token, so each output is bit for bit what that decode step would
give (up to the float32 order of the readout's sum); ``"prefill"`` holds the ``T`` states in float32
between the tokens, as a chunked prefill holds them inside a chunk, so the outputs after the first
differ from the decode steps' by the state format's rounding. With an 8-bit state that rounding
is most of a verify step's arithmetic (the row's absmax, the stochastic bits, the codes and back, every
token). The kernels compute "prefill" as a prefill computes a chunk: the stored state read once, the
``T`` tokens' outputs from tensor-core products with it and with the tokens' decayed scores
(:func:`~.triton_numerics.decayed_scores`; the delta rule's updates through the inverse of a ``T x T``
unit triangle), no pass over the state per token, with bf16 operands for bf16 inputs as the chunked
prefill takes them; their outputs agree with the reference's float32 recurrence to float32 accuracy for
float32 inputs, to bf16 products' for bf16 ones (the first output too), not bit for bit. The commit is the
decode steps' either way, for the inputs it is given (in a model, the mixers above the first get inputs that
the float32 states moved).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .format_names import VERIFY_NUMERICS
from .state import StateQuantizer, load_pool_slots, store_slot_states
from .state_io import pool_args, verify_launch

MAX_VERIFY_TOKENS = 16


class Kept(NamedTuple):
    """The state after each verified token, as a decode step would have stored it: ``data``
    ``[B, T, H, K, V]`` in the storage dtype, ``scale`` ``[B, T, H, K]`` float32 (None: plain formats)."""

    data: torch.Tensor
    scale: torch.Tensor | None

    @classmethod
    def empty_like_pool(cls, state: torch.Tensor, scale: torch.Tensor | None, batch: int, tokens: int) -> Kept:
        return cls(state.new_empty(batch, tokens, *state.shape[1:]),
                   None if scale is None else scale.new_empty(batch, tokens, *scale.shape[1:]))


def check_tokens(T: int) -> None:
    if not 1 <= T <= MAX_VERIFY_TOKENS:
        raise ValueError(f"a verify step takes 1 to {MAX_VERIFY_TOKENS} tokens per sequence; got {T}")


def rounds_each_token(numerics: str, kept) -> bool:
    """Whether a verify step with these ``numerics`` stores the state after every token (checked): ``"decode"``;
    ``"prefill"`` runs the one-chunk kernels (the ``"verify_prefill"`` step of :func:`launch_args`)."""
    if numerics not in VERIFY_NUMERICS:
        raise ValueError(f"numerics must be one of {', '.join(VERIFY_NUMERICS)}; got {numerics!r}")
    if numerics == "prefill" and kept is not None:
        raise ValueError("kept states are the decode steps' states: keep them with numerics='decode' (or commit "
                         "by recomputing, which any numerics allows)")
    return numerics == "decode"


def verify_step(numerics: str, kept) -> str:
    """The launch-table step (:func:`launch_args`) of a verify step with these ``numerics`` (checked): the one-chunk
    kernels' ``"verify_prefill"``, or the token-by-token kernel's ``"verify"`` (``"commit"``'s entry when it keeps
    every token's state: it stores like a commit)."""
    if not rounds_each_token(numerics, kept):
        return "verify_prefill"
    return "verify" if kept is None else "commit"


def accepted_counts(accepted, batch: int, tokens: int, device) -> torch.Tensor:
    """``accepted`` (an int or ``[B]``) as an int32 ``[B]`` tensor, each in ``0..tokens`` (checked on
    the host except inside a CUDA graph capture, where a check would sync: the caller's counts
    come from the device, as a speculative round's do)."""
    n = torch.as_tensor(accepted, dtype=torch.int32, device=device).expand(batch).contiguous()
    capturing = n.is_cuda and torch.cuda.is_current_stream_capturing()
    if n.numel() and not capturing and (int(n.min()) < 0 or int(n.max()) > tokens):
        raise ValueError(f"accepted counts must lie in 0..{tokens} (the verified tokens); got {n.tolist()}")
    return n


def pool_steps_reference(step: Callable, T: int, state, scale, pool_idx, quantizer: StateQuantizer, n_stores=None,
                         seed: int = 0, kept: Kept | None = None, accepted: torch.Tensor | None = None,
                         numerics: str = "decode") -> list:
    """``step(t, h) -> (o_t, new h)`` for ``t < T`` from the pool slots ``pool_idx``, the state stored
    (and loaded back) after every token as decode step ``t`` would store it (``numerics="prefill"``:
    held in float32 instead, outputs only). ``kept``: each stored state written there. ``accepted``
    ``[B]`` (commit): slot ``b`` gets its state after ``accepted[b]`` tokens (none: unchanged).
    Returns the outputs ``o_t``."""
    check_tokens(T)
    if not rounds_each_token(numerics, kept):
        if accepted is not None:
            raise ValueError("a commit stores the decode steps' states: numerics='decode'")
        h = load_pool_slots(state, scale, pool_idx, quantizer)
        outs = []
        for t in range(T):
            o, h = step(t, h)
            outs.append(o)
        return outs
    idx = pool_idx.long()
    data, sc = state[idx], scale[idx] if scale is not None else None
    h = load_pool_slots(state, scale, pool_idx, quantizer)
    base = n_stores[idx].long() if n_stores is not None else None
    outs = []
    for t in range(T):
        o, h = step(t, h)
        outs.append(o)
        data, sc = store_slot_states(h, sc, quantizer, idx, base + 1 + t if base is not None else None, seed)
        h = quantizer.load(data, sc.unsqueeze(-1) if sc is not None else None)
        if kept is not None:
            kept.data[:, t] = data
            if sc is not None:
                kept.scale[:, t] = sc
        if accepted is not None:
            rows = (accepted == t + 1).nonzero().flatten()
            state[idx[rows]] = data[rows]
            if scale is not None:
                scale[idx[rows]] = sc[rows]
    return outs


def commit_kept(state, scale, pool_idx, kept: Kept, accepted) -> None:
    """Write the kept state after ``accepted[b]`` tokens into slot ``pool_idx[b]`` (0: unchanged), in
    place; no host sync, so a CUDA graph can capture it."""
    B, T = kept.data.shape[:2]
    n = torch.as_tensor(accepted, device=state.device).expand(B).long()
    idx = pool_idx.long()
    rows = torch.arange(B, device=state.device)
    pick = (n - 1).clamp_min(0)
    take = (n > 0).view(B, *([1] * (state.dim() - 1)))
    bits = (lambda x: x.view(torch.uint8)) if state.element_size() == 1 else (lambda x: x)  # fp8: no torch.where
    state[idx] = torch.where(take, bits(kept.data[rows, pick]), bits(state[idx])).view(state.dtype)
    if scale is not None:
        scale[idx] = torch.where(take[..., 0], kept.scale[rows, pick], scale[idx])


def _pow2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def chunk_launch(consts: dict, T: int, dtype: torch.dtype) -> dict:
    """The one-chunk verify kernels' constexprs (``numerics="prefill"``) from :func:`launch_args`' for its
    ``"verify_prefill"`` step: the K and V blocks, the ``T`` token rows padded to a power of two of at least 16 (a
    tensor-core product's least side), the state format, and bf16 products for bf16 / fp16 inputs."""
    return dict(BLOCK_K=consts["BLOCK_K"], BLOCK_V=consts["BLOCK_V"], BLOCK_T=max(16, _pow2(T)), FMT=consts["FMT"],
                LOW_PRECISION=dtype in (torch.bfloat16, torch.float16))


def launch_args(state, scale, pool_idx, n_stores, quantizer, H, K, V, kernel, step, block_k=None, block_v=None,
                num_warps=None, prefetch=None):
    """The pool's pointers, strides and constexprs for a verify kernel (``kernel``: GLA's, the delta rule's;
    ``step``: ``"verify"``, ``"commit"`` or ``"verify_prefill"``, the one-chunk kernels of ``numerics="prefill"``),
    with ``block_k``, ``block_v``, ``num_warps`` and ``prefetch`` (the next token's inputs loaded during this token's
    arithmetic) defaulting to the table's entry for the format and launch size
    (:data:`~laquant.kernels.common.state_io.VERIFY_LAUNCH`); a block of None is the whole dimension, and a scaled
    format storing its state takes the whole V (its row scale spans the row), the one-chunk kernels V blocks of at
    least 16. Also the V grid."""
    fmt = quantizer.format
    default_k, default_v, default_warps, default_prefetch = verify_launch(kernel, step, fmt.name,
                                                                          pool_idx.numel() * H)
    block_k = min(block_k or default_k or _pow2(K), _pow2(K))
    pool, pool_strides, consts, _ = pool_args(state, scale, pool_idx, n_stores, quantizer, H, K, block_k, 1)
    full_v = _pow2(V)
    if step == "verify_prefill":  # one chunk: the whole K, and K and V are sides of tensor-core products
        consts["BLOCK_K"] = max(16, _pow2(K))
        block_v = max(16, min(full_v, _pow2(block_v or default_v or full_v)))
    else:
        block_v = full_v if fmt.is_scaled else min(full_v, _pow2(block_v or default_v or full_v))
    consts["BLOCK_V"] = block_v
    consts["PREFETCH"] = default_prefetch if prefetch is None else bool(prefetch)
    return pool, pool_strides, consts, num_warps or default_warps, -(-V // block_v)


def kept_args(kept: Kept | None, dummy: torch.Tensor, B: int, T: int, state: torch.Tensor):
    """The side buffer's pointers and strides (dummies without one)."""
    if kept is None:
        return (dummy, dummy), (0,) * 7
    if tuple(kept.data.shape) != (B, T, *state.shape[1:]) or kept.data.dtype != state.dtype or \
            kept.data.stride(-1) != 1:
        raise ValueError(f"kept must be [B, T, H, K, V] = {(B, T, *state.shape[1:])} in {state.dtype}, V contiguous")
    sc = kept.scale if kept.scale is not None else kept.data
    return (kept.data, sc), (*kept.data.stride()[:4], *(sc.stride()[:3] if kept.scale is not None else (0, 0, 0)))
