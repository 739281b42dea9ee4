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
* the positions: ``position_ids`` is a view of ``pos``, so the rotary embedding follows it.

:meth:`StaticHybridCache.begin_step` (inside the captured step, before the forward) opens position
``pos`` in the mask and returns the forward's extra arguments; :meth:`end_step` moves ``pos`` on. The
attention of a step reads all ``capacity`` positions, masked: one graph serves the whole decode.
"""

from __future__ import annotations

import torch

from laquant.models.cache import HybridStates, state_store


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
    (see the module's docstring); what ``past_key_values`` takes in a graphed decode step."""

    def __init__(self, states: HybridStates, kv: dict[int, tuple[torch.Tensor, torch.Tensor]], batch: int,
                 capacity: int, dtype: torch.dtype, device):
        self.laquant_states = states  # where state_store() finds the linear layers' store
        self.kv = kv
        self.capacity = capacity
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.mask = torch.full((batch, 1, 1, capacity), torch.finfo(dtype).min, dtype=dtype, device=device)

    @classmethod
    def from_cache(cls, cache, capacity: int) -> StaticHybridCache:
        """A static copy of the prefilled transformers ``cache`` with room for ``capacity`` tokens in all."""
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
        out = cls(static_states, buffers, ref.shape[0], capacity, dtype, ref.device)
        out.load_from(cache)
        return out

    def load_from(self, cache) -> None:
        """Copy a prefilled transformers ``cache`` (of the same layout) into the static tensors."""
        states = state_store(cache)
        seen = states.seen_tokens
        if seen >= self.capacity:
            raise ValueError(f"the cache to load holds {seen} tokens; this static cache has room for {self.capacity}")
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
        self.mask[..., :seen] = 0
        self.pos.fill_(seen)

    def begin_step(self) -> dict:
        """Open position ``pos`` for this step's token; the forward's extra arguments."""
        self.mask.index_fill_(-1, self.pos, 0)
        return {"position_ids": self.pos.view(1, 1), "attention_mask": self.mask}

    def end_step(self) -> None:
        self.pos += 1

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


__all__ = ["StaticHybridCache", "kv_layers"]
