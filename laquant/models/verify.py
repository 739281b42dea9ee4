"""Speculative decoding's verify step for laquant's own models (GLA, Gated DeltaNet, fla's hybrids of
them with softmax ``attn`` layers): :func:`verify` runs ``T`` tokens per sequence on a prefilled
:class:`~laquant.models.cache.GLAStateCache` and returns the logits of all of them, leaving the cache
as it was; :func:`commit` then accepts the first ``n`` of them, which leaves the cache as ``n``
decode steps would have: each mixer's state through the pool kernels' commit
(:mod:`laquant.kernels.common.pool_steps`; bit-identical to ``n`` decode steps for the same mixer
inputs), the short convs' last inputs and the softmax layers' keys and values cut back to ``n``
tokens. Every sequence accepts the same ``n`` here (the cache counts stores per batch); the kernels
take a count per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module

import torch

from laquant.errors import LaquantError
from laquant.kernels.common.dispatch import use_triton
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
    mixers: dict = field(default_factory=dict)
    conv: dict = field(default_factory=dict)


def verify(model, input_ids: torch.Tensor, cache: GLAStateCache) -> torch.Tensor:
    """The logits ``[B, T, vocab]`` of ``input_ids [B, T]`` (``T`` in 1..16) continuing ``cache``,
    which keeps its states until :func:`commit` (one verify pending at a time)."""
    if not isinstance(cache, GLAStateCache):
        raise LaquantError("verify needs laquant's GLAStateCache (laquant's GLA or Gated DeltaNet model), "
                           f"not {type(cache).__name__}")
    if cache.pending is not None:
        raise LaquantError("a verify step is pending on this cache: commit(cache, n) it first")
    if cache.slots is not None:
        raise LaquantError("verify runs on an ordinary cache, not a static (CUDA-graph) copy")
    if not any(s is not None for s in cache.states) and not cache.kv:
        raise LaquantError("verify continues a prefilled cache: run the prompt through the model first")
    T = input_ids.shape[1]
    if not 1 <= T <= MAX_VERIFY_TOKENS:
        raise LaquantError(f"a verify step takes 1 to {MAX_VERIFY_TOKENS} tokens per sequence; got {T}")
    cache.pending = PendingVerify(T, cache.seen_tokens, {i: kv[0].shape[1] for i, kv in cache.kv.items()})
    try:
        return model(input_ids=input_ids, past_key_values=cache, use_cache=True).logits
    except BaseException:
        cache.pending = None
        raise


def commit(cache: GLAStateCache, accepted: int) -> None:
    """Accept the first ``accepted`` (``0..T``) tokens of the pending verify step."""
    pending = cache.pending
    if pending is None:
        raise LaquantError("no verify step is pending on this cache")
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


def verify_mixer(mixer, states: GLAStateCache, stored: State | None, kind: str, inputs: tuple, **kw) -> torch.Tensor:
    """A recurrent mixer's part of a verify step (``kind`` "gla": q, k, v, g ``[B, T, H, K]``; "delta":
    q, k, v, g, beta as :func:`~laquant.kernels.delta.verify.delta_verify` takes them): the outputs
    ``[B, T, H, V]``, the state left as stored, and its commit registered on ``states.pending``."""
    if stored is None:
        raise LaquantError("verify continues a prefilled cache: run the prompt through the model first")
    quant = mixer.state_quantizer
    B = inputs[0].shape[0]
    device = inputs[0].device
    module = import_module(f"laquant.kernels.{kind}.verify")  # the Triton kernels, or their references
    suffix = "" if use_triton(inputs[0], quant.format.name) else "_reference"
    verify_fn, commit_fn = (getattr(module, f"{kind}_{what}{suffix}") for what in ("verify", "commit"))
    pool_idx = torch.arange(B, dtype=torch.int32, device=device)
    n_stores = torch.full((B,), stored.n_stores, dtype=torch.int32, device=device)
    pool = (stored.data, stored.row_scale, pool_idx, quant)
    kw["seed"] = states.seed
    o = verify_fn(*inputs, *pool, n_stores, **kw)

    def accept(n: int) -> None:
        if n:
            commit_fn(*inputs, *pool, n, n_stores, **kw)
            states.states[mixer.layer_idx] = State(stored.data, stored.scale, stored.format, stored.n_stores + n)

    states.pending.mixers[mixer.layer_idx] = accept
    return o
