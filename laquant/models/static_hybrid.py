"""A static cache for a transformers hybrid's decode step, so that one CUDA graph can replay it.

An eager decode step of a transformers hybrid is 15-25 ms of Python and launches for under 1 ms of
GPU work (``eval/results/graphed_prefill_h200/profile_hybrid_decode.json``). Replaying it as a graph
needs every tensor the step reads or writes to stay where it was at capture, and every value that
changes from step to step to live on the device:

* the linear layers' states and short-conv inputs: a static :class:`~laquant.models.cache.HybridStates`
  (the decode kernels update the states in place and count stores on the device; the short convs copy
  their new inputs into the kept tensors);
* the softmax layers' keys and values: buffers of ``capacity`` positions per layer, written at the
  device-side position ``pos`` by :meth:`StaticHybridCache.update` (what transformers' attention layers
  call), which returns the whole buffers;
* the attention mask: an additive ``[B, 1, 1, capacity]`` mask, 0 up to ``pos`` and the dtype's
  minimum after it, passed to the model as a ready 4-D mask (transformers uses a 4-D mask as given,
  and the linear layers take none at one token);
* the positions: ``position_ids`` is a view of ``pos``, so the rotary embedding follows it; in a cache made for a
  left-padded batch (``padded``, transformers' ``generate`` on prompts of several lengths) it is a ``[B, 1]`` buffer
  of each sequence's own position, written before each step (the mask then hides each sequence's padded positions,
  as :meth:`StaticHybridCache.load_from` is told);
* the attention: transformers' SDPA path repeats every key head for its query heads before a masked
  call (``repeat_kv``), which over the whole capacity was most of a B = 64 step (4.8 of 9.5 ms on the
  1.14B qwen3_next, ``eval/results/graphed_hybrid_h200.md``). :func:`static_decode_attention` (registered
  with transformers as ``laquant_static_decode`` and switched on by :func:`static_attention` for the
  static steps only) runs laquant's decode attention kernel on CUDA
  (:func:`~laquant.kernels.attention.decode.decode_attention_triton`: one launch, the query heads grouped
  by their key head so each key and value is read once, the scores and softmax in float32 as SDPA's
  kernels compute them, and the positions after the last one the mask shows, the room not yet written,
  left unread), else transformers' eager attention with the query heads grouped the same way
  (:func:`grouped_eager_attention`).

:meth:`StaticHybridCache.begin_step` (inside the captured step, before the forward) opens position
``pos`` in the mask and returns the forward's extra arguments; :meth:`end_step` moves ``pos`` on. The
attention of a step is captured over all ``capacity`` positions, masked, so one graph serves the whole
decode; the kernel reads the positions up to ``pos`` (the eager formula all of them).
"""

from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from laquant.kernels.attention import decode as attention_kernels
from laquant.kernels.common.dispatch import use_triton
from laquant.models.cache import HybridStates, state_store

ATTENTION = "laquant_static_decode"
_UNSUPPORTED = ("softcap", "s_aux", "sliding_window", "position_bias")  # left to transformers' SDPA


def static_decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention over ``query [B, Hq, T, D]``, ``key [B, Hkv, S, D]`` and ``value [B, Hkv, S, Dv]`` with the
    query heads grouped by their key head instead of the keys repeated per query head: laquant's decode
    attention kernel where Triton runs, it takes the inputs and no gradient is wanted, else transformers'
    eager attention (scores in the input dtype, the mask added, softmax in float32); returns
    ``([B, T, Hq, Dv], None)`` as transformers' attention functions do."""
    if any(kwargs.get(k) is not None for k in _UNSUPPORTED):
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, scaling=scaling,
                                               dropout=dropout, **kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if (use_triton(query) and (dropout == 0.0 or not module.training)
            and attention_kernels.fits(query, key, value, attention_mask)
            and not (torch.is_grad_enabled() and (key.requires_grad or value.requires_grad))):  # forward-only
        return attention_kernels.decode_attention_triton(query, key, value, attention_mask, scaling), None
    return grouped_eager_attention(query, key, value, attention_mask, scaling), None


def grouped_eager_attention(query, key, value, attention_mask, scaling: float) -> torch.Tensor:
    """transformers' eager attention (scores in the input dtype, the mask ``[B, 1, T, S']`` added, softmax in
    float32) with the query heads grouped by their key head; ``[B, T, Hq, Dv]``."""
    B, Hq, T, D = query.shape
    Hkv, S = key.shape[1], key.shape[-2]
    G = Hq // Hkv
    scores = torch.matmul(query.reshape(B, Hkv, G * T, D), key.transpose(-1, -2)) * scaling
    if attention_mask is not None:  # broadcast over the key heads and their groups
        scores = (scores.view(B, Hkv, G, T, S) + attention_mask[:, :, None, :, :S]).view(B, Hkv, G * T, S)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs, value).view(B, Hq, T, value.shape[-1])
    return out.transpose(1, 2).contiguous()


AttentionInterface.register(ATTENTION, static_decode_attention)


@contextlib.contextmanager
def static_attention(model):
    """Within: ``model``'s attention layers run :func:`static_decode_attention` (set on every config its
    modules read, restored after)."""
    configs = {id(c): c for m in model.modules()
               if hasattr(c := getattr(m, "config", None), "_attn_implementation_internal")}
    saved = {k: c._attn_implementation_internal for k, c in configs.items()}
    for c in configs.values():
        c._attn_implementation_internal = ATTENTION
    try:
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation_internal = saved[k]


def kv_layers(cache) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """The keys and values ``[B, H, T, D]`` of a transformers cache's softmax-attention layers, by layer."""
    out = {}
    for i, layer in enumerate(getattr(cache, "layers", ())):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.numel():
            out[i] = (keys, layer.values)
    return out


class StaticHybridCache:
    """The decode-time cache of a transformers hybrid with laquant's mixers, in static tensors
    (see the module's docstring); what the forward's cache keyword takes in a graphed decode step."""

    def __init__(self, states: HybridStates, kv: dict[int, tuple[torch.Tensor, torch.Tensor]], batch: int,
                 capacity: int, dtype: torch.dtype, device, padded: bool = False):
        self.laquant_states = states  # where state_store() finds the linear layers' store
        self.kv = kv
        self.capacity = capacity
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.mask = torch.full((batch, 1, 1, capacity), torch.finfo(dtype).min, dtype=dtype, device=device)
        # a padded batch's positions, one a sequence (set_positions); None: every sequence's is pos
        self.positions = torch.zeros(batch, 1, dtype=torch.long, device=device) if padded else None

    @property
    def padded(self) -> bool:
        return self.positions is not None

    @classmethod
    def from_cache(cls, cache, capacity: int, padded: bool = False, keys: torch.Tensor | None = None
                   ) -> StaticHybridCache:
        """A static copy of the prefilled transformers ``cache`` with room for ``capacity`` tokens in all; ``padded``,
        ``keys``: as :meth:`load_from` takes them."""
        states = state_store(cache)
        if states is None or not states.states:
            raise ValueError("a static hybrid cache needs the linear layers' states: run the prompt through the "
                             "model first")
        seen = states.seen_tokens
        kv = kv_layers(cache)
        for i, (k, _) in kv.items():
            if k.shape[-2] != seen:
                raise ValueError(f"cache layer {i} keeps {k.shape[-2]} of the {seen} tokens' keys (a sliding "
                                 "window or another layout): a static cache keeps every token's; decode eagerly")
        if capacity < seen + 1:
            raise ValueError(f"a static cache of {capacity} tokens cannot continue {seen} cached ones")
        static_states = states.static_copy()
        ref = next(iter(static_states.states.values())).data
        dtype = next(iter(kv.values()))[0].dtype if kv else torch.float32
        buffers = {i: (k.new_zeros(*k.shape[:-2], capacity, k.shape[-1]),
                       v.new_zeros(*v.shape[:-2], capacity, v.shape[-1])) for i, (k, v) in kv.items()}
        out = cls(static_states, buffers, ref.shape[0], capacity, dtype, ref.device, padded=padded)
        out.load_from(cache, keys)
        return out

    def load_from(self, cache, keys: torch.Tensor | None = None) -> None:
        """Copy a prefilled transformers ``cache`` (of the same layout) into the static tensors. ``keys`` (bool
        ``[B, seen]``, a padded cache's): the cached positions each sequence attends to, False at its padding (None:
        all of them)."""
        states = state_store(cache)
        seen = states.seen_tokens
        if seen >= self.capacity:
            raise ValueError(f"the cache to load holds {seen} tokens; this static cache has room for {self.capacity}")
        if keys is not None and (not self.padded or tuple(keys.shape) != (self.mask.shape[0], seen)):
            raise ValueError(f"a mask of the cached positions {tuple(keys.shape)} needs a padded static cache of "
                             f"{self.mask.shape[0]} sequences after {seen} tokens")
        kv = kv_layers(cache)
        if sorted(kv) != sorted(self.kv):
            raise ValueError("the cache to load does not match the static cache's attention layers")
        self.laquant_states.load_from(states)
        for i, (k, v) in kv.items():
            mk, mv = self.kv[i]
            if k.shape[:-2] != mk.shape[:-2] or k.shape[-2] != seen:
                raise ValueError(f"cache layer {i}'s keys {tuple(k.shape)} do not fit the static cache's "
                                 f"{tuple(mk.shape)} after {seen} tokens")
            mk[..., :seen, :].copy_(k)
            mv[..., :seen, :].copy_(v)
        self.mask.fill_(torch.finfo(self.mask.dtype).min)
        if keys is None:
            self.mask[..., :seen] = 0
        else:
            self.mask[:, 0, 0, :seen].masked_fill_(keys.to(self.mask.device, torch.bool), 0)
        self.pos.fill_(seen)
        if self.padded:  # each sequence's next position: its attended positions so far (transformers' count)
            counts = keys.sum(-1, keepdim=True) if keys is not None else torch.full_like(self.positions, seen)
            self.positions.copy_(counts)

    def set_positions(self, position_ids: torch.Tensor) -> None:
        """A padded cache's positions of the next step's tokens ``[B, 1]`` (transformers' ``position_ids``)."""
        self.positions.copy_(position_ids)

    def begin_step(self) -> dict:
        """Open position ``pos`` for this step's token; the forward's extra arguments."""
        self.mask.index_fill_(-1, self.pos, 0)
        return {"position_ids": self.positions if self.padded else self.pos.view(1, 1), "attention_mask": self.mask}

    def end_step(self) -> None:
        self.pos += 1
        if self.padded:
            self.positions += 1

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """transformers' ``Cache.update``: write the step's keys and values at ``pos``, return every position's."""
        keys, values = self.kv[layer_idx]
        keys.index_copy_(-2, self.pos, key_states)
        values.index_copy_(-2, self.pos, value_states)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.laquant_states.seen_tokens

    def sync_counters(self) -> int:
        """Bring the host-side counters up to the device's (one sync); the decode steps since the last."""
        return self.laquant_states.sync_counters()


__all__ = ["StaticHybridCache", "grouped_eager_attention", "kv_layers", "static_attention", "static_decode_attention"]
