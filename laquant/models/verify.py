"""Speculative decoding's verify step for laquant's own models (GLA, Gated DeltaNet, fla's hybrids of
them with softmax ``attn`` layers): :func:`verify` runs ``T`` tokens per sequence on a prefilled
:class:`~laquant.models.cache.GLAStateCache` and returns the logits of all of them, leaving the cache
as it was; :func:`commit` then accepts the first ``n`` of them, which leaves the cache as ``n``
decode steps would have: each mixer's state through the pool kernels' commit
(:mod:`laquant.kernels.common.pool_steps`; bit-identical to ``n`` decode steps for the same mixer
inputs), the short convs' last inputs and the softmax layers' keys and values cut back to ``n``
tokens. Every sequence accepts the same ``n`` here (the cache counts stores per batch); the kernels
take a count per sequence.

On a static cache (:meth:`GLAStateCache.static_copy`, whose states the kernels update in place and
whose store count lives on the device) both run without a host sync, so a CUDA graph can capture a
whole speculative round (:mod:`laquant.serving.speculative`): the pool slots and store counts are the
static cache's, and :func:`commit` takes the accepted count as a device tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module

import torch

from laquant.adapters import cache_kwargs
from laquant.errors import LaquantError
from laquant.kernels.common.dispatch import use_triton
from laquant.kernels.common.format_names import VERIFY_NUMERICS
from laquant.kernels.common.pool_steps import MAX_VERIFY_TOKENS
from laquant.kernels.common.state import State
from laquant.models.cache import GLAStateCache


@dataclass
class PendingVerify:
    """What a verify step left for :func:`commit`: per mixer, a function accepting ``n`` tokens; the
    short convs' inputs (the ``W - 1`` kept ones, then the ``T`` new ones); the softmax layers' key
    counts and the cache's token count before the step."""

    tokens: int
    seen: int
    kv_len: dict
    numerics: str = "decode"
    mixers: dict = field(default_factory=dict)
    conv: dict = field(default_factory=dict)


def verify(model, input_ids: torch.Tensor, cache: GLAStateCache, logits_to_keep: int = 0,
           numerics: str = "decode") -> torch.Tensor:
    """The logits ``[B, T, vocab]`` of ``input_ids [B, T]`` (``T`` in 1..16) continuing ``cache``,
    which keeps its states until :func:`commit` (one verify pending at a time). ``logits_to_keep``:
    only the last that many positions' logits (0: all). ``numerics``: ``"decode"`` (each position's
    logits as that decode step would give them: the mixers round their state to its format after every
    token) or ``"prefill"`` (the states held in float32 between the tokens, as a prefill holds them:
    faster, the logits after the first position differing by the format's rounding; the GPU kernels compute
    the tokens as one prefill chunk, with a bf16 model's bf16 products, so there the first position's too agree
    with "decode" to that rounding only; :mod:`laquant.kernels.common.pool_steps`). The commit stores each
    mixer's state as its decode steps would from the inputs it saw: with "prefill", the mixers after the first
    saw inputs that the float32 states below them moved a little, so the cache is then as after a prefill of
    those tokens, not bit for bit plain decoding's."""
    if numerics not in VERIFY_NUMERICS:
        raise LaquantError(f"numerics must be one of {', '.join(VERIFY_NUMERICS)}; got {numerics!r}")
    if not isinstance(cache, GLAStateCache):
        raise LaquantError("verify needs laquant's GLAStateCache (laquant's GLA or Gated DeltaNet model), "
                           f"not {type(cache).__name__}")
    if cache.pending is not None:
        raise LaquantError("a verify step is pending on this cache: commit(cache, n) it first")
    if not any(s is not None for s in cache.states) and not cache.kv:
        raise LaquantError("verify continues a prefilled cache: run the prompt through the model first")
    T = input_ids.shape[1]
    if not 1 <= T <= MAX_VERIFY_TOKENS:
        raise LaquantError(f"a verify step takes 1 to {MAX_VERIFY_TOKENS} tokens per sequence; got {T}")
    cache.pending = PendingVerify(T, cache.seen_tokens, {i: kv[0].shape[1] for i, kv in cache.kv.items()}, numerics)
    try:
        return model(input_ids=input_ids, **cache_kwargs(model, cache), use_cache=True,
                     logits_to_keep=logits_to_keep).logits
    except BaseException:
        cache.pending = None
        raise


def commit(cache: GLAStateCache, accepted: int | torch.Tensor) -> None:
    """Accept the first ``accepted`` (``0..T``) tokens of the pending verify step. On a static cache
    ``accepted`` may be a one-element int64 / int32 device tensor (every row accepts that many, in
    ``0..T``; not checked on the host): no host sync."""
    pending = cache.pending
    if pending is None:
        raise LaquantError("no verify step is pending on this cache")
    if isinstance(accepted, torch.Tensor):
        _commit_static(cache, pending, accepted)
        return
    if isinstance(accepted, bool) or not isinstance(accepted, int) or not 0 <= accepted <= pending.tokens:
        raise LaquantError(f"accepted must be an integer in 0..{pending.tokens} (the verified tokens); got "
                           f"{accepted!r}")
    for accept in pending.mixers.values():
        accept(accepted)
    for key, inp in pending.conv.items():
        width = inp.shape[1] - pending.tokens  # W - 1
        cache.conv[key] = inp[:, accepted:accepted + width]
    for layer, n in pending.kv_len.items():
        k, v = cache.kv[layer]
        cache.kv[layer] = (k[:, :n + accepted], v[:, :n + accepted])
    cache.seen_tokens = pending.seen + accepted
    cache.pending = None


def _commit_static(cache: GLAStateCache, pending: PendingVerify, accepted: torch.Tensor) -> None:
    """:func:`commit` with device-side counts on a static cache: the mixers' slots get their states in
    place, the short convs' kept inputs their windows, the shared store counter moves on by the counts
    (``seen_tokens`` follows at the next :meth:`~GLAStateCache.sync_counters`)."""
    slots = cache.slots
    if slots is None:
        raise LaquantError("commit takes a count tensor on a static cache only (an ordinary cache counts its "
                           "stores on the host): pass an int")
    if accepted.dtype not in (torch.int32, torch.int64) or accepted.numel() != 1:
        raise LaquantError("accepted must be a one-element integer tensor (a static cache counts its stores once for "
                           f"all rows); got {accepted.dtype} {tuple(accepted.shape)}")
    n = accepted.reshape(-1).expand(slots.n_stores.shape[0]).to(torch.int32)
    for accept in pending.mixers.values():
        accept(n)
    for key, inp in pending.conv.items():
        width = inp.shape[1] - pending.tokens  # W - 1
        window = n.long()[:, None] + torch.arange(width, device=inp.device)
        cache.conv[key].copy_(inp.gather(1, window[..., None].expand(-1, -1, inp.shape[2])))
    slots.n_stores.add_(n)
    cache.pending = None


def verify_mixer(mixer, states: GLAStateCache, stored: State | None, kind: str, inputs: tuple, **kw) -> torch.Tensor:
    """A recurrent mixer's part of a verify step (``kind`` "gla": q, k, v, g ``[B, T, H, K]``; "delta":
    q, k, v, g, beta as :func:`~laquant.kernels.delta.verify.delta_verify` takes them): the outputs
    ``[B, T, H, V]``, the state left as stored, and its commit registered on ``states.pending``."""
    if stored is None:
        raise LaquantError("verify continues a prefilled cache: run the prompt through the model first")
    quant = mixer.state_quantizer
    module = import_module(f"laquant.kernels.{kind}.verify")  # the Triton kernels, or their references
    suffix = "" if use_triton(inputs[0], quant.format.name) else "_reference"
    verify_fn, commit_fn = (getattr(module, f"{kind}_{what}{suffix}") for what in ("verify", "commit"))
    pool_idx, _, n_stores = mixer._pool_slots(stored, inputs[0].shape[0], inputs[0].device)
    pool = (stored.data, stored.row_scale, pool_idx, quant)
    kw["seed"] = states.seed
    o = verify_fn(*inputs, *pool, n_stores, numerics=states.pending.numerics, **kw)

    def accept(n: int | torch.Tensor) -> None:
        if isinstance(n, torch.Tensor):  # a static cache: in place, counted by commit on the device
            commit_fn(*inputs, *pool, n, n_stores, **kw)
        elif n:
            commit_fn(*inputs, *pool, n, n_stores, **kw)
            states.states[mixer.layer_idx] = State(stored.data, stored.scale, stored.format, stored.n_stores + n)

    states.pending.mixers[mixer.layer_idx] = accept
    return o
