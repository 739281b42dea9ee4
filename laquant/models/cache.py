"""Recurrent-state cache for incremental decoding of linear-attention models."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from laquant.kernels.common.dispatch import use_triton
from laquant.kernels.common.format_names import SCALED_STATE_FORMATS
from laquant.kernels.common.state import State
from laquant.kernels.common.state_io import CHUNK, store_states
from laquant.kernels.common.store import store_states_triton


@dataclass
class CheckpointRequest:
    """Asks a prefill for the state after every ``every`` tokens of the call (a multiple of 64): the
    mixers put each layer's snapshots in ``states`` (:class:`State` ``[B, C, H, K, V]`` in ``format``,
    None: the layer's own state format) and the short convs theirs in ``conv`` (``[B, C, W - 1, C]``).
    A snapshot is the prefill's running float32 state at that token, stored once with fresh scales
    (:func:`~laquant.kernels.common.state_io.store_states`, keyed as the chunk kernels key their
    checkpoints), so it is what the kernels' ``checkpoint_every`` writes. Read by laquant.serving."""

    every: int
    format: str | None = None
    rounding: str | None = None  # None: the layer's rounding where the format is scaled, else nearest
    states: dict = field(default_factory=dict)
    conv: dict = field(default_factory=dict)

    def keep_states(self, layer_idx: int, ckpt: torch.Tensor, quantizer, seed: int, position: int) -> None:
        """Store the float32 checkpoints ``ckpt`` ``[B, C, H, K, V]`` of one layer's prefill (its
        stores keyed by ``position``, the chunk kernel's: the store after the initial state's)."""
        fmt = self.format or quantizer.format.name
        rounding = self.rounding or quantizer.rounding
        if rounding == "stochastic" and fmt not in SCALED_STATE_FORMATS:  # stochastic applies to scaled formats
            rounding = "nearest"
        subs = [(c + 1) * self.every // CHUNK for c in range(ckpt.shape[1])]
        store = store_states_triton if use_triton(ckpt, fmt) else store_states
        self.states[layer_idx] = store(ckpt.float(), fmt, rounding, seed, position, subs)

    def keep_conv(self, key, inputs: torch.Tensor, width: int) -> None:
        """A short conv's last ``width - 1`` inputs after every ``every`` tokens of ``inputs``
        ``[B, W - 1 + T, C]`` (the carried inputs, then the call's)."""
        T = inputs.shape[1] - (width - 1)
        ends = range(self.every, T + 1, self.every)
        self.conv[key] = torch.stack([inputs[:, e:e + width - 1] for e in ends], 1) if ends else None


@dataclass
class DecodeSlots:
    """What the decode kernels read besides the states, kept as persistent device tensors by a
    static cache so that a CUDA graph of a decode step replays them: ``pool_idx`` ``[B]`` int32
    (pool slot ``b`` is sequence ``b``) and ``n_stores`` ``[B]`` int32, the stores made so far. All
    layers step together, so one counter serves them all: the last stateful layer advances it in
    place once per step (:meth:`GLAStateCache.count_static_step`). ``synced`` is the count the
    Python-side ``State.n_stores`` were last brought up to (:meth:`GLAStateCache.sync_counters`)."""

    pool_idx: torch.Tensor
    n_stores: torch.Tensor
    last_layer: int
    synced: int


@dataclass
class StaticState(State):
    """A state of a static cache: its tensors are updated in place by the decode kernels and the
    store count lives on the device (``slots``); ``n_stores`` is synced after a run of steps."""

    slots: DecodeSlots | None = None


class GLAStateCache:
    """One recurrent state ``[B, H, K, V]`` per layer in the layer's storage format, plus the
    number of tokens seen. Unlike a KV cache it does not grow: a linear-attention layer's whole
    memory of the past is its state. ``seed`` keys the random bits of stochastically rounded
    states (with the batch row, the store count and the element), so a run is reproducible."""

    def __init__(self, num_layers: int, seed: int = 0):
        self.states: list[State | None] = [None] * num_layers
        self.seen_tokens = 0
        self.conv: dict = {}  # short convs' last inputs, by (layer, projection)
        self.kv: dict = {}  # softmax-attention layers' keys and values (fla's ``attn`` layers), by layer
        # a static copy's: those layers' key / value buffers [B, H, capacity, D] and the position the next token's
        # key goes to (on the device: a captured step writes there and moves it on)
        self.static_kv: dict = {}
        self.kv_pos: torch.Tensor | None = None
        self.seed = check_seed(seed)
        self.pending = None  # a verify step awaiting its commit (laquant.models.verify)
        self.checkpoints: CheckpointRequest | None = None  # snapshots the next prefill also writes
        # [B, T] of the next call, 0 past a sequence's real tokens: their keys and log-decays become
        # zero, so the state passes them unchanged (a padded prefill replayed as a CUDA graph)
        self.token_mask: torch.Tensor | None = None
        self.static = False  # short convs copy their new inputs into the kept tensors (a static copy)
        # holds a captured step's static tensors (laquant.models.graphed_step): its eager steps advance the
        # Python-side counters too, as the replays do, so it never needs a sync
        self.counts_on_host = False
        self.step_graph = None  # the captured step whose static tensors it holds

    def get(self, layer_idx: int) -> State | None:
        return self.states[layer_idx]

    def update(self, layer_idx: int, stored: State, new_tokens: int) -> None:
        self.states[layer_idx] = stored
        if layer_idx == len(self.states) - 1:
            self.seen_tokens += new_tokens

    def update_kv(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, new_tokens: int) -> None:
        self.kv[layer_idx] = (k, v)
        if layer_idx == len(self.states) - 1:
            self.seen_tokens += new_tokens

    def __len__(self) -> int:
        return sum(s is not None for s in self.states)

    @property
    def slots(self) -> DecodeSlots | None:
        """The shared decode tensors of a static cache (None: an ordinary cache)."""
        return _slots(self.states)

    @property
    def capacity(self) -> int | None:
        """The positions a static copy's attn layers keep keys for (None: no key buffers)."""
        return next(iter(self.static_kv.values()))[0].shape[2] if self.static_kv else None

    def static_copy(self, capacity: int | None = None) -> GLAStateCache:
        """A static cache holding copies of this cache's states and short convs' inputs (every recurrent
        layer must hold a state, all stored the same number of times, with kernel-addressable storage:
        the decode steps then run in place on the Triton kernels, and the convs copy into their inputs),
        and, for softmax ``attn`` layers, key and value buffers of ``capacity`` positions (the decode
        steps write each token's at the device-side ``kv_pos``)."""
        if any(s is None for i, s in enumerate(self.states) if i not in self.kv) or len(self.kv) == len(self.states):
            raise ValueError("a static cache needs every layer's state: run the prompt through the model first")
        if self.kv and (capacity is None or capacity <= self.seen_tokens):
            raise ValueError(f"a static cache of {capacity} positions cannot continue {self.seen_tokens} cached "
                             "tokens' keys")
        out = GLAStateCache(len(self.states), self.seed)
        last = max(i for i, s in enumerate(self.states) if s is not None)
        out.states = _static_states(self.states, last)
        out.conv = {key: t.clone() for key, t in self.conv.items()}
        if self.kv:
            out.static_kv = {i: tuple(t.new_zeros(t.shape[0], t.shape[2], capacity, t.shape[3]) for t in kv)
                             for i, kv in self.kv.items()}
            out.kv_pos = torch.zeros(1, dtype=torch.long, device=next(iter(self.kv.values()))[0].device)
            _load_kv(out, self)
        out.seen_tokens, out.static = self.seen_tokens, True
        return out

    def load_from(self, other: GLAStateCache) -> None:
        """Copy ``other``'s states, conv inputs, keys and counters into this static cache's tensors (no
        reallocation)."""
        _load_states(self, self.states, other.states, other.seed)
        _load_conv(self.conv, other.conv)
        _load_kv(self, other)
        self.seen_tokens = other.seen_tokens

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """transformers' beam search: the batch rows ``beam_idx`` of the states, conv inputs and attn keys
        (:func:`reorder_rows`)."""
        if self.pending is not None:
            raise ValueError("a cache with a pending verify step cannot be reordered: commit it first")
        reorder_rows(self, beam_idx)
        self.kv = {i: tuple(t.index_select(0, beam_idx.to(t.device)) for t in kv) for i, kv in self.kv.items()}

    def count_static_step(self, layer_idx: int, new_tokens: int = 1) -> None:
        """A decode step of layer ``layer_idx`` on a static cache: the shared device counter moves
        on once per step (at the last layer), in place, so a captured step advances it on replay."""
        _count_static_step(self.slots, layer_idx)
        if self.counts_on_host and layer_idx == self.slots.last_layer:
            # the tokens are counted by the model's last layer: a softmax attn layer after it counts them itself
            self.advance_host_counters(new_tokens if layer_idx == len(self.states) - 1 else 0)

    def advance_host_counters(self, new_tokens: int = 1) -> None:
        """The Python side of one more store of every layer's static state (``new_tokens`` seen), where
        the device counter has moved on with it (a replay, or an eager step of a cache that counts on
        the host)."""
        _advance_host_counters(self, self.states, new_tokens)

    def sync_counters(self) -> int:
        """Bring the Python-side counters (``State.n_stores``, ``seen_tokens``) of a static cache up
        to its device counter (one host sync); returns the decode steps since the last sync."""
        steps = _sync_counters(self.states)
        self.seen_tokens += steps
        return steps

    def state_bytes(self) -> int:
        return sum(s.nbytes() for s in self.states if s is not None)


class HybridStates:
    """The recurrent (and short-conv) states of a transformers hybrid's linear layers, kept beside
    transformers' own cache (whose KV layers serve the softmax-attention layers). Stored in
    laquant's formats, so they do not depend on how a transformers version lays out its cache.
    A static copy (:meth:`static_copy`, for a CUDA-graphed decode step) updates its states and conv
    inputs in place and counts stores on the device, as :class:`GLAStateCache`'s does."""

    def __init__(self, seed: int = 0):
        self.states: dict[int, State] = {}
        self.conv: dict[int, torch.Tensor] = {}
        self.seen_tokens = 0
        self.seed = check_seed(seed)  # as GLAStateCache.seed
        self.checkpoints: CheckpointRequest | None = None  # as GLAStateCache.checkpoints (laquant.serving)
        self.static = False  # short convs copy their new inputs into the kept tensors (laquant.models.static_hybrid)
        self.counts_on_host = False  # as GLAStateCache.counts_on_host
        self.step_graph = None

    def get(self, layer_idx: int) -> State | None:
        return self.states.get(layer_idx)

    def update(self, layer_idx: int, stored: State, new_tokens: int) -> None:
        self.states[layer_idx] = stored

    def state_bytes(self) -> int:
        return sum(s.nbytes() for s in self.states.values())

    @property
    def slots(self) -> DecodeSlots | None:
        return _slots(list(self.states.values()))

    def static_copy(self) -> HybridStates:
        """Copies of the states and conv inputs that decode steps update in place (every linear layer
        must hold a state, all stored the same number of times)."""
        if not self.states:
            raise ValueError("a static cache needs the linear layers' states: run the prompt through the model first")
        out = HybridStates(self.seed)
        layers = sorted(self.states)
        out.states = dict(zip(layers, _static_states([self.states[i] for i in layers], max(layers))))
        out.conv = {i: t.clone() for i, t in self.conv.items()}
        out.seen_tokens, out.static = self.seen_tokens, True
        return out

    def load_from(self, other: HybridStates) -> None:
        if sorted(other.states) != sorted(self.states):
            raise ValueError("the cache to load does not match the static cache's layers")
        _load_states(self, [self.states[i] for i in sorted(self.states)],
                     [other.states[i] for i in sorted(self.states)], other.seed)
        _load_conv(self.conv, other.conv)
        self.seen_tokens = other.seen_tokens

    def count_static_step(self, layer_idx: int, new_tokens: int = 1) -> None:
        _count_static_step(self.slots, layer_idx)
        if self.counts_on_host and layer_idx == self.slots.last_layer:
            self.advance_host_counters(0)  # an eager call's tokens are counted by the positions hook (adapters.hybrid)

    def advance_host_counters(self, new_tokens: int = 1) -> None:
        _advance_host_counters(self, list(self.states.values()), new_tokens)

    def sync_counters(self) -> int:
        steps = _sync_counters(list(self.states.values()))
        self.seen_tokens += steps
        return steps


def reorder_rows(store, rows: torch.Tensor) -> None:
    """The batch rows ``rows`` of every state and conv input of ``store`` (a :class:`GLAStateCache` or
    :class:`HybridStates`), as transformers' beam search reorders a cache between its steps. New tensors: a
    cache holding a captured decode step's static tensors lets them go, as when another cache adopts them (the
    step adopts it again); a static copy itself decodes a fixed batch in place and is refused."""
    if store.static and not store.counts_on_host:
        raise ValueError("a static cache's batch rows cannot be reordered: it decodes a fixed batch in place")

    def take(t: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, rows.to(t.device))

    def reordered(s: State | None) -> State | None:
        return None if s is None else State(take(s.data), None if s.scale is None else take(s.scale), s.format,
                                            s.n_stores)

    if isinstance(store.states, dict):
        store.states = {i: reordered(s) for i, s in store.states.items()}
    else:
        store.states = [reordered(s) for s in store.states]
    store.conv = {k: take(t) for k, t in store.conv.items()}
    store.static = store.counts_on_host = False
    store.step_graph = None


# A static cache (laquant.generate's CUDA-graphed decode loop): every decode step updates the same
# tensors in place and counts stores on the device, so a replayed step is an eager one.

def _slots(states) -> DecodeSlots | None:
    first = next((s for s in states if s is not None), None)
    return getattr(first, "slots", None)


def _static_states(states: list[State | None], last_layer: int) -> list[StaticState | None]:
    """Copies of ``states`` (None where a layer keeps keys instead) sharing one :class:`DecodeSlots` whose
    counter the layer ``last_layer`` advances."""
    present = [s for s in states if s is not None]
    counts = {s.n_stores for s in present}
    if len(counts) != 1:
        raise ValueError(f"the layers' states were stored {sorted(counts)} times; a static cache steps all together")
    n, batch, device = counts.pop(), present[0].data.shape[0], present[0].data.device
    slots = DecodeSlots(torch.arange(batch, dtype=torch.int32, device=device),
                        torch.full((batch,), n, dtype=torch.int32, device=device), last_layer, n)
    return [None if s is None else StaticState(s.data.clone(), None if s.scale is None else s.scale.clone(), s.format,
                                               n, slots) for s in states]


def _load_states(static, mine: list[StaticState | None], theirs: list[State | None], seed: int) -> None:
    if seed != static.seed:  # a captured decode step launches its kernels with this cache's seed
        raise ValueError(f"the cache to load has seed {seed}; this static cache's is {static.seed}")
    for m, t in zip(mine, theirs):
        if m is None and t is None:  # a softmax attn layer
            continue
        if m is None or t is None or t.data.shape != m.data.shape or t.format != m.format:
            raise ValueError("the cache to load does not match the static cache's layout")
        m.data.copy_(t.data)
        if m.scale is not None:
            m.scale.copy_(t.scale)
        m.n_stores = t.n_stores
    first = next(t for t in theirs if t is not None)
    slots, their_slots = _slots(mine), getattr(first, "slots", None)
    if their_slots is not None:  # another static cache: its device counter (no host value; a graph may capture it)
        slots.n_stores.copy_(their_slots.n_stores)
        slots.synced = their_slots.synced
    else:
        slots.n_stores.fill_(first.n_stores)
        slots.synced = first.n_stores


def _load_kv(static: GLAStateCache, other: GLAStateCache) -> None:
    """Copy ``other``'s softmax attn layers' keys and values ``[B, T, H, D]`` (a static cache's: up to its
    position) into the static buffers, and set the static position after them."""
    source = other.static_kv or {i: tuple(t.transpose(1, 2) for t in kv) for i, kv in other.kv.items()}
    if sorted(source) != sorted(static.static_kv):
        raise ValueError("the cache to load does not match the static cache's attn layers")
    seen = other.seen_tokens
    if static.static_kv and seen >= static.capacity:
        raise ValueError(f"the cache to load holds {seen} tokens; this static cache has room for {static.capacity}")
    for i, (keys, values) in static.static_kv.items():
        k, v = (t[:, :, :seen] for t in source[i])  # a static source's buffers hold room after them
        if k.shape[:2] != keys.shape[:2] or k.shape[2] != seen or k.shape[3] != keys.shape[3]:
            raise ValueError(f"attn layer {i}'s keys {tuple(k.shape)} do not fit the static cache's "
                             f"{tuple(keys.shape)} after {seen} tokens")
        keys[:, :, :seen].copy_(k)
        values[:, :, :seen].copy_(v)
    if static.kv_pos is not None:
        static.kv_pos.fill_(seen)


def _load_conv(mine: dict, theirs: dict) -> None:
    if sorted(mine, key=str) != sorted(theirs, key=str) or any(theirs[k].shape != t.shape for k, t in mine.items()):
        raise ValueError("the cache to load does not match the static cache's conv inputs")
    for key, t in mine.items():
        t.copy_(theirs[key])


def _count_static_step(slots: DecodeSlots, layer_idx: int) -> None:
    if layer_idx == slots.last_layer:
        slots.n_stores.add_(1)


def _advance_host_counters(store, states: list[StaticState | None], new_tokens: int) -> None:
    for s in states:
        if s is not None:
            s.n_stores += 1
    store.slots.synced += 1
    store.seen_tokens += new_tokens


def _sync_counters(states: list[StaticState | None]) -> int:
    slots = _slots(states)
    n = int(slots.n_stores[0])
    steps = n - slots.synced
    for s in states:
        if s is not None:
            s.n_stores = n
    slots.synced = n
    return steps


def state_layout(states) -> tuple:
    """What a captured graph's static copies of ``states`` depend on: each one's shape, dtype, format
    and whether it has a scale (a key of the graphs laquant.generate and laquant.serving capture)."""
    return tuple(None if s is None else (tuple(s.data.shape), s.data.dtype, s.format, s.scale is None)
                 for s in states)


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"the state cache's seed must be an integer in [0, 2**63); got {seed!r}")
    return seed


# the keywords a forward takes its cache by, and the output names it returns it under, in the order they are looked
# for: ``cache`` from transformers 5.24 on, ``cache_params`` (Mamba-2 models) or ``past_key_values`` before
CACHE_KEYWORDS = ("cache", "cache_params", "past_key_values")


def passed_cache(kwargs: dict):
    """The cache a transformers forward was called with (by one of :data:`CACHE_KEYWORDS`)."""
    return next((kwargs[name] for name in CACHE_KEYWORDS if kwargs.get(name) is not None), None)


def state_store(cache) -> GLAStateCache | HybridStates | None:
    """Where the linear layers keep their states for ``cache``: a :class:`GLAStateCache` is its own
    store; any other (transformers) cache gets a :class:`HybridStates` attached on first use."""
    if cache is None or isinstance(cache, GLAStateCache):
        return cache
    store = getattr(cache, "laquant_states", None)
    if store is None:
        store = HybridStates()
        cache.laquant_states = store
    return store


class ContiguousKV:
    """A mixin for transformers' caches (before the cache class): the new keys and values are made contiguous before
    the cache concatenates them. A quantized model's k and v are column slices of one fused GEMM's output, and
    ``torch.cat`` with a strided input runs its unvectorized kernel over the whole cached length: in a B = 64 eager
    Nemotron-H step the 12 key / value concatenations took 1.26 ms against bf16's 0.21 ms
    (``eval/results/weight_only_fallback_h200/run1/``). Copying the new tokens' slices costs one small copy each."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(key_states.contiguous(), value_states.contiguous(), layer_idx, *args, **kwargs)


@functools.cache
def _dynamic_cache_class():
    from transformers import DynamicCache

    return type("LaquantDynamicCache", (ContiguousKV, DynamicCache), {"__module__": __name__})


def dynamic_cache(config):
    """transformers' ``DynamicCache`` for ``config`` with :class:`ContiguousKV`."""
    return _dynamic_cache_class()(config=config)
