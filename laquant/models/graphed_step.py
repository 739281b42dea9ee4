"""transformers' ``generate`` on laquant's models with each decode step one CUDA graph replay.

transformers' ``generate`` calls the model's forward once per new token. Run eagerly, a decode step
of a 1.37B GLA launches ~300 kernels: 24-49 ms of host time on an H200 for ~2 ms of GPU work
(``eval/results/hf_generate_graphs_h200/``), so ``model.generate`` was 10-25x slower than laquant's
own graphed loop, and a quantized model (Triton launches cost the host more than cuBLAS calls) slower
than its bf16 original.

So a decode step that transformers' generate hands over replays a graph where the step allows it: one
new token per sequence on CUDA, no gradients, and

* laquant's GLA (and Gated DeltaNet, DeltaNet): :meth:`GLAForCausalLM.prepare_inputs_for_generation`
  marks the step (``graph_step=True``); the cache must be a :class:`~laquant.models.cache.GLAStateCache`
  with every recurrent layer's state (fla's softmax ``attn`` layers: their keys, in buffers as a hybrid's)
  and no pending verify, checkpoint request or token mask (:func:`graph_step_allowed`);
* a transformers hybrid with laquant's mixers (every family): the adapter wraps the
  instance's ``prepare_inputs_for_generation`` and ``forward`` (``laquant.adapters.hybrid``); the
  transformers cache must keep every token's keys (:func:`hybrid_graph_step`). A left-padded batch (transformers'
  ``generate`` on prompts of several lengths) replays a graph of its own, whose static cache masks each
  sequence's padded positions and takes each sequence's position from transformers' ``position_ids``.

The graph is captured once per (model, batch size, state / conv / key layout, seed, parameter storage)
on a static cache (softmax layers' keys in buffers with room for 1,024 more tokens; a larger one is captured
when they fill). The caller's cache then **adopts** the static tensors. Its states, conv inputs and
keys are copied in at the first step of a generate call; from then on its states are the static ones
and its softmax layers hold views of the key buffers. So a later step is a copy of the new tokens and
a replay. The Python-side counters (``State.n_stores``, ``seen_tokens``) are advanced on the host
after each replay (no sync), so eager calls on the same cache go on from the right place. A cache
adopted by a later generate call of the same shape takes the tensors over, and the earlier cache keeps
copies of its own.

The replay runs the static-cache step that laquant's own graphed loop runs. For laquant's GLA, its
logits are the eager step's bit for bit (without softmax attn layers). Softmax attention is then the static
step's grouped kernel (:func:`~laquant.models.static_hybrid.static_decode_attention`), equal to the eager
step's to float32 rounding (``tests/test_graphed_step.py``). MoE experts run the implementation
:func:`~laquant.moe_experts.decode_experts_implementation` picks for the batch (transformers' generate
switches them to ``batched_mm`` for decoding, which at B = 64 gathered ~2.2 GB a layer of a 1.4B model), and
``batched_mm`` where ``grouped_mm`` cannot be captured. A step the GPU refuses to capture, or whose states
are not updated in place, runs eagerly from then on. ``LAQUANT_GRAPH_STEPS=0`` or
``model.laquant_graph_steps = False`` turns the graphs off; :func:`release_step_graphs` frees them.
"""

from __future__ import annotations

import os
import weakref

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from laquant.generate import (_state_tensors, capture_graph, static_cache, static_forward,
                              warm_up_outside_capture)
from laquant.kernels.common.state import State
from laquant.models.cache import GLAStateCache, passed_cache, state_layout, state_store
from laquant.moe_experts import decode_experts_implementation, experts_implementation

_GRAPHS = "_laquant_step_graphs"
ROOM = 1024  # a hybrid's static keys: room for this many more tokens, the whole rounded up to a multiple of it

# the output's cache field: `cache` from transformers 5.24 on (`past_key_values` there logs a deprecation)
OUTPUT_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def graph_steps_enabled(model) -> bool:
    return getattr(model, "laquant_graph_steps", True) and os.environ.get("LAQUANT_GRAPH_STEPS", "1") != "0"


def graph_step_allowed(model, input_ids: torch.Tensor, cache, labels, logits_to_keep: int) -> bool:
    """Whether this forward call of laquant's GLA can be a replay (see the module's docstring)."""
    return (_replayable_call(model, input_ids, labels, logits_to_keep) and isinstance(cache, GLAStateCache)
            and cache.pending is None and cache.checkpoints is None and cache.token_mask is None
            and len(cache.kv) < len(cache.states)
            and all(s is not None for i, s in enumerate(cache.states) if i not in cache.kv))


def _replayable_call(model, input_ids, labels, logits_to_keep) -> bool:
    return (graph_steps_enabled(model) and isinstance(input_ids, torch.Tensor) and _on_graph_device(input_ids)
            and input_ids.dim() == 2 and input_ids.shape[1] == 1 and labels is None and logits_to_keep == 1
            and not model.training and not torch.is_grad_enabled() and not _capturing())


def _on_graph_device(t: torch.Tensor) -> bool:
    return t.is_cuda


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def hybrid_graph_step(model, args: tuple, kwargs: dict):
    """transformers' forward output of one decode step of a transformers hybrid with laquant's mixers as
    a replay, or None where it runs eagerly: besides :func:`graph_step_allowed`'s conditions, the
    transformers cache must hold every token's keys (no sliding window); without padding the positions
    transformers passes must all equal the cached length, and a padded batch (a 2-D mask with zeros) must pass
    its positions and attend this step's token in every sequence."""
    from laquant.models.static_hybrid import StaticHybridCache, kv_layers

    ids = kwargs.get("input_ids", args[0] if args else None)
    cache = passed_cache(kwargs)
    if (len(args) > 1 or not _replayable_call(model, ids, kwargs.get("labels"), kwargs.get("logits_to_keep", 0))
            or cache is None or isinstance(cache, StaticHybridCache) or kwargs.get("inputs_embeds") is not None
            or kwargs.get("output_attentions") or kwargs.get("output_hidden_states")):
        return None
    store = state_store(cache)
    if not store.states or store.checkpoints is not None:
        return None
    lengths = {k.shape[-2] for k, _ in kv_layers(cache).values()}
    if len(lengths) > 1:
        return None
    seen = lengths.pop() if lengths else store.seen_tokens
    positions, mask = kwargs.get("position_ids"), kwargs.get("attention_mask")
    if mask is not None and mask.dim() != 2:
        return None
    keys = None  # a padded batch's cached positions that each sequence attends to
    if mask is not None and not bool(mask.all()):
        B = ids.shape[0]
        if (tuple(mask.shape) != (B, seen + 1) or positions is None or tuple(positions.shape) != (B, 1)
                or not bool(mask[:, seen].all())):
            return None
        keys = mask[:, :seen].bool()
    elif positions is not None and not bool((positions == seen).all()):  # positions of their own
        return None
    store.seen_tokens = seen  # transformers' generate passes the positions, so laquant's count may lag
    logits = graphed_step(model, ids, cache, keys, positions if keys is not None else None)
    if logits is None:
        return None
    return CausalLMOutputWithPast(logits=logits, **{OUTPUT_CACHE_FIELD: cache})


def graphed_step(model, input_ids: torch.Tensor, cache, keys: torch.Tensor | None = None,
                 positions: torch.Tensor | None = None) -> torch.Tensor | None:
    """The logits ``[B, 1, V]`` of one decode step as a graph replay, the cache advanced as an eager
    step would advance it; None where this step must run eagerly (a capture the GPU refused, states
    that cannot be static: then every later call of the same key is eager too). ``keys``, ``positions``: a
    left-padded batch's (a hybrid's): the cached positions each sequence attends to (bool ``[B, seen]``) and the
    step's positions ``[B, 1]``."""
    store = state_store(cache)
    seen = store.seen_tokens
    graph = store.step_graph
    padded = keys is not None
    full = lambda g: g.capacity is not None and g.capacity <= seen  # noqa: E731  (a hybrid's key buffers)
    if graph is None or not graph.held_by(cache) or full(graph) or graph.padded != padded:
        # a generate call's first step, keys to grow, or a batch padded where the held graph's was not (or the reverse)
        graphs = model.__dict__.setdefault(_GRAPHS, {})
        key = _key(model, cache, padded)
        graph = graphs.get(key)
        if graph and full(graph):  # captured again with room for ROOM more tokens (the cache keeps copies)
            graphs.pop(key).release()
            graph = None
        if graph is None:
            for stale in [k for k in graphs if k[-1] != key[-1]]:  # captured on parameters since moved or replaced
                old = graphs.pop(stale)
                if old:
                    old.release()
            try:
                # normal tensors even under torch.inference_mode: a later generate without it updates them in place
                with torch.inference_mode(False), torch.no_grad():
                    graph = StepGraph(model, cache, -(-(seen + ROOM) // ROOM) * ROOM, capture=input_ids.is_cuda,
                                      keys=keys)
            except (ValueError, _Refused):
                graph = False
            graphs[key] = graph
        if graph is False:
            return None
    return graph.run(cache, input_ids, keys, positions)


def release_step_graphs(model) -> None:
    """Free the decode-step graphs (and their static caches) captured for ``model``."""
    for graph in model.__dict__.pop(_GRAPHS, {}).values():
        if graph:
            graph.release()


def _key(model, cache, padded: bool = False) -> tuple:
    """What a captured step depends on: the batch, the states', conv inputs' and keys' layout, the seed
    (a launch argument), whether the batch is padded (its positions are one a sequence) and the parameters'
    storage (a model moved or reloaded needs a new capture)."""
    store = state_store(cache)
    states = _state_tensors(cache)
    conv = tuple((str(k), tuple(t.shape), t.dtype) for k, t in sorted(store.conv.items(), key=lambda kv: str(kv[0])))
    kv = tuple((i, tuple(k.shape[:-2]), k.shape[-1], v.shape[-1], k.dtype) for i, (k, v) in _held_keys(cache).items())
    params = tuple(p.data_ptr() for p in model.parameters())
    return states[0].data.shape[0], state_layout(states), conv, kv, store.seed, padded, params


class _Refused(Exception):
    pass


class StepGraph:
    """One captured decode step of ``model`` on a static cache (laquant's GLA: a static
    :class:`GLAStateCache`; a transformers hybrid: a :class:`~laquant.models.static_hybrid.StaticHybridCache`
    with keys for ``capacity`` tokens), and the cache that has adopted its tensors. ``capture=False``:
    the step runs eagerly on the static cache (the CPU stand-in of a replay, for tests). ``keys``: a left-padded
    batch's cached positions each sequence attends to (see :func:`graphed_step`)."""

    def __init__(self, model, cache, capacity: int, capture: bool = True, keys: torch.Tensor | None = None):
        self.model = weakref.ref(model)  # the model holds its graphs: no reference cycle
        self.static = static_cache(cache, capacity, keys)  # ValueError where the states cannot be static
        self.keys = None  # the adopted cache's padding: the positions of its first tokens each sequence attends to
        self.store = state_store(self.static)
        self.capacity = self.static.capacity  # None: no softmax layers' keys
        first = _state_tensors(self.static)[0].data
        self.ids = torch.zeros(first.shape[0], 1, dtype=torch.long, device=first.device)
        self.owner = None  # a weakref to the cache holding the static tensors
        self.graph = None
        self.logits = None
        self.experts = decode_experts_implementation(model, first.shape[0])  # None: as the model is set
        if not capture:
            return
        try:
            self._capture()
        except _Refused:
            if self.experts is None:
                raise
            self.experts = None  # the model's setting (grouped_mm copies from the host where torch has no fp32 kernel)
            self._capture()

    def _capture(self) -> None:
        states = _state_tensors(self.static)
        warm_up_outside_capture(self._step)
        if any(a is not b for a, b in zip(states, _state_tensors(self.static))):
            raise _Refused("the decode step replaced its states instead of updating them in place")
        try:
            self.graph, self.logits = capture_graph(self._step)
        except RuntimeError as exc:
            raise _Refused(str(exc)) from exc

    def _step(self) -> torch.Tensor:
        model = self.model()
        with experts_implementation(model, self.experts):
            return static_forward(model, self.ids, self.static)[:, None]

    @property
    def padded(self) -> bool:
        """Whether its static cache is a padded batch's (a hybrid's, see :func:`graphed_step`)."""
        return getattr(self.static, "padded", False)

    def held_by(self, cache) -> bool:
        owner = self.owner() if self.owner is not None else None
        return owner is cache and _holds(cache, self.static)

    def run(self, cache, input_ids: torch.Tensor, keys: torch.Tensor | None = None,
            positions: torch.Tensor | None = None) -> torch.Tensor:
        if not self.held_by(cache) or not self._same_padding(keys):
            self._adopt(cache, keys)
        if positions is not None:
            self.static.set_positions(positions)
        self.ids.copy_(input_ids)
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits.clone()  # the next replay overwrites the static logits
        else:
            logits = self._step()
        store = state_store(cache)
        store.advance_host_counters()
        _mirror_keys(cache, self.static, store.seen_tokens)
        return logits

    def _same_padding(self, keys: torch.Tensor | None) -> bool:
        """Whether ``keys`` (a padded batch's, see :func:`graphed_step`) continue the padding adopted: the same
        positions masked, every later one attended."""
        if self.keys is None or keys is None:
            return self.keys is None and keys is None
        n = self.keys.shape[1]
        return keys.shape[0] == self.keys.shape[0] and keys.shape[1] >= n and bool(
            (keys[:, :n] == self.keys).all() & keys[:, n:].all())

    def _adopt(self, cache, keys: torch.Tensor | None = None) -> None:
        """Make ``cache`` hold the static tensors with its current contents (``keys``: its padding, as
        :func:`graphed_step` takes it); a cache that held any of them before keeps copies."""
        owner = self.owner() if self.owner is not None else None
        if owner is not None and owner is not cache:
            _detach(owner, self.static)
        if keys is None:
            self.static.load_from(cache)
        else:
            self.static.load_from(cache, keys)
        self.keys = None if keys is None else keys.clone()
        store = state_store(cache)
        store.states = dict(self.store.states) if isinstance(self.store.states, dict) else list(self.store.states)
        store.conv = dict(self.store.conv)
        store.static = True  # short convs write their kept inputs in place, as on the static cache
        store.counts_on_host = True  # eager steps on it advance the host counters too
        store.step_graph = self
        _mirror_keys(cache, self.static, store.seen_tokens)
        self.owner = weakref.ref(cache)

    def release(self) -> None:
        owner = self.owner() if self.owner is not None else None
        if owner is not None:
            _detach(owner, self.static)
        self.owner = self.graph = self.logits = None


def _kv_buffers(static) -> dict:
    """A static cache's softmax layers' key and value buffers ``[B, H, capacity, D]``, by layer."""
    return static.static_kv if isinstance(static, GLAStateCache) else static.kv


def _held_keys(cache) -> dict:
    """The keys and values ``[B, H, T, D]`` that ``cache``'s softmax layers hold, by layer (laquant's GLA keeps
    fla's attn layers' as ``[B, T, H, D]``)."""
    from laquant.models.static_hybrid import kv_layers

    if isinstance(cache, GLAStateCache):
        return {i: (k.transpose(1, 2), v.transpose(1, 2)) for i, (k, v) in cache.kv.items()}
    return kv_layers(cache)


def _hold_keys(cache, i: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    if isinstance(cache, GLAStateCache):
        cache.kv[i] = (keys.transpose(1, 2), values.transpose(1, 2))
    else:
        layer = cache.layers[i]
        layer.keys, layer.values = keys, values


def _mirror_keys(cache, static, seen: int) -> None:
    """``cache``'s softmax layers hold the first ``seen`` positions of the static key and value buffers
    (views: an eager step on it concatenates onto them, into new tensors)."""
    for i, (keys, values) in _kv_buffers(static).items():
        _hold_keys(cache, i, keys[..., :seen, :], values[..., :seen, :])


def _holds(cache, static) -> bool:
    store, mine = state_store(cache), state_store(static)
    held, static_states = _state_tensors(cache), _state_tensors(static)
    if len(held) != len(static_states) or any(a is not b for a, b in zip(held, static_states)):
        return False
    if store.conv.keys() != mine.conv.keys() or any(store.conv[k] is not t for k, t in mine.conv.items()):
        return False
    held = _held_keys(cache)
    for i, (keys, _) in _kv_buffers(static).items():
        kept = held.get(i)
        if kept is None or kept[0].data_ptr() != keys.data_ptr() or kept[0].shape[-2] != store.seen_tokens:
            return False
    return True


def _detach(cache, static) -> None:
    """Give ``cache`` copies of whichever of ``static``'s tensors it holds (another cache adopts them next)."""
    store, mine = state_store(cache), state_store(static)
    ids = {id(s) for s in _state_tensors(static)}

    def copy(s):
        if s is None or id(s) not in ids:
            return s
        return State(s.data.clone(), None if s.scale is None else s.scale.clone(), s.format, s.n_stores)

    if isinstance(store.states, dict):
        store.states = {i: copy(s) for i, s in store.states.items()}
    else:
        store.states = [copy(s) for s in store.states]
    shared = {id(t) for t in mine.conv.values()}
    store.conv = {k: t.clone() if id(t) in shared else t for k, t in store.conv.items()}
    store.static = store.counts_on_host = False
    store.step_graph = None
    held = _held_keys(cache)
    for i, (keys, _) in _kv_buffers(static).items():
        kept = held.get(i)
        if kept is not None and kept[0].data_ptr() == keys.data_ptr():
            _hold_keys(cache, i, kept[0].clone(), kept[1].clone())
