"""transformers' ``generate`` on laquant's GLA with each decode step one CUDA graph replay.

transformers' ``generate`` calls the model's forward once per new token. Run eagerly, a decode step
of a 1.37B GLA launches ~300 kernels: 24-49 ms of host time on an H200 for ~2 ms of GPU work
(``eval/results/hf_generate_graphs_h200/``), so ``model.generate`` was 10-25x slower than laquant's
own graphed loop, and a quantized model (Triton launches cost the host more than cuBLAS calls) slower
than its bf16 original.

So the forward of a step that :meth:`GLAForCausalLM.prepare_inputs_for_generation` hands over
(``graph_step=True``: transformers' generate, and lm-eval's generation through it) replays a graph
when the step allows it (:func:`graph_step_allowed`): one new token per sequence on CUDA, no
gradients, a :class:`~laquant.models.cache.GLAStateCache` holding every layer's state and nothing
else (no softmax ``attn`` keys, no pending verify, no checkpoint request). The graph is captured once
per (model, batch size, state and conv layout, seed, parameters) on a static cache
(:meth:`GLAStateCache.static_copy`); the caller's cache then **adopts** that static cache's tensors:
its states are copied in at the first step of a generate call, and the cache holds the static tensors
from then on, so later steps are a copy of the new tokens and a replay. Its Python-side counters
(``State.n_stores``, ``seen_tokens``) are advanced on the host after each replay (no sync), so eager
calls on the same cache go on from the right place; a cache adopted by a later generate call of the
same shape takes the tensors over, and the earlier cache keeps copies of its own.

The replay runs the same kernels, on the same static-cache path, as an eager step: the logits are the
eager step's bit for bit (``tests/test_graphed_step.py``). A step the GPU refuses to capture (or whose
states are not updated in place) runs eagerly from then on. ``LAQUANT_GRAPH_STEPS=0`` or
``model.laquant_graph_steps = False`` turns the graphs off; :func:`release_step_graphs` frees them.
"""

from __future__ import annotations

import os
import weakref

import torch

from laquant.kernels.common.state import State
from laquant.models.cache import GLAStateCache, state_layout

_GRAPHS = "_laquant_step_graphs"


def graph_steps_enabled(model) -> bool:
    return getattr(model, "laquant_graph_steps", True) and os.environ.get("LAQUANT_GRAPH_STEPS", "1") != "0"


def graph_step_allowed(model, input_ids: torch.Tensor, cache, labels, logits_to_keep: int) -> bool:
    """Whether this forward call can be a replay (see the module's docstring)."""
    return (graph_steps_enabled(model) and _on_graph_device(input_ids) and input_ids.dim() == 2
            and input_ids.shape[1] == 1 and labels is None and logits_to_keep == 1 and not model.training
            and not torch.is_grad_enabled() and isinstance(cache, GLAStateCache) and not cache.kv
            and cache.pending is None and cache.checkpoints is None and cache.token_mask is None
            and all(s is not None for s in cache.states) and not _capturing())


def _on_graph_device(t: torch.Tensor) -> bool:
    return t.is_cuda


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def graphed_step(model, input_ids: torch.Tensor, cache: GLAStateCache) -> torch.Tensor | None:
    """The logits ``[B, 1, V]`` of one decode step as a graph replay, the cache advanced as an eager
    step would advance it; None where this step must run eagerly (a capture the GPU refused, states
    that cannot be static: then every later call of the same key is eager too)."""
    graph = getattr(cache, "step_graph", None)
    if graph is None or not graph.held_by(cache):  # the first step of a generate call: find or capture its graph
        graphs = model.__dict__.setdefault(_GRAPHS, {})
        key = _key(model, cache)
        graph = graphs.get(key)
        if graph is None:
            for stale in [k for k in graphs if k[-1] != key[-1]]:  # captured on parameters since moved or replaced
                old = graphs.pop(stale)
                if old:
                    old.release()
            try:
                # normal tensors even under torch.inference_mode: a later generate without it updates them in place
                with torch.inference_mode(False), torch.no_grad():
                    graph = StepGraph(model, cache, capture=input_ids.is_cuda)
            except (ValueError, _Refused):
                graph = False
            graphs[key] = graph
        if graph is False:
            return None
    return graph.run(cache, input_ids)


def release_step_graphs(model) -> None:
    """Free the decode-step graphs (and their static caches) captured for ``model``."""
    for graph in model.__dict__.pop(_GRAPHS, {}).values():
        if graph:
            graph.release()


def _key(model, cache: GLAStateCache) -> tuple:
    """What a captured step depends on: the batch, the states' and conv inputs' layout, the seed (a
    launch argument) and the parameters' storage (a model moved or reloaded needs a new capture)."""
    conv = tuple((str(k), tuple(t.shape), t.dtype) for k, t in sorted(cache.conv.items(), key=lambda kv: str(kv[0])))
    params = tuple(p.data_ptr() for p in model.parameters())
    return cache.states[0].data.shape[0], state_layout(cache.states), conv, cache.seed, params


class _Refused(Exception):
    pass


class StepGraph:
    """One captured decode step of ``model`` on a static cache, and the cache that has adopted its
    tensors. ``capture=False``: the step runs eagerly on the static cache (the CPU stand-in of a
    replay, for tests)."""

    def __init__(self, model, cache: GLAStateCache, capture: bool = True):
        from laquant.generate import capture_graph, warm_up_outside_capture

        self.model = model
        self.static = cache.static_copy()  # ValueError where the states cannot be static
        self.ids = torch.zeros(cache.states[0].data.shape[0], 1, dtype=torch.long,
                               device=cache.states[0].data.device)
        self.owner = None  # a weakref to the cache holding the static tensors
        self.graph = None
        self.logits = None
        if not capture:
            return
        states = list(self.static.states)
        warm_up_outside_capture(self._step)
        if any(a is not b for a, b in zip(states, self.static.states)):
            raise _Refused("the decode step replaced its states instead of updating them in place")
        try:
            self.graph, self.logits = capture_graph(self._step)
        except RuntimeError as exc:
            raise _Refused(str(exc)) from exc

    def _step(self) -> torch.Tensor:
        return self.model(input_ids=self.ids, cache=self.static, use_cache=True, logits_to_keep=1).logits

    def held_by(self, cache: GLAStateCache) -> bool:
        owner = self.owner() if self.owner is not None else None
        return owner is cache and _holds(cache, self.static)

    def run(self, cache: GLAStateCache, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.held_by(cache):
            self._adopt(cache)
        self.ids.copy_(input_ids)
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits.clone()  # the next replay overwrites the static logits
        else:
            logits = self._step()
        cache.advance_host_counters()
        return logits

    def _adopt(self, cache: GLAStateCache) -> None:
        """Make ``cache`` hold the static tensors with its current contents; a cache that held any of
        them before keeps copies."""
        owner = self.owner() if self.owner is not None else None
        if owner is not None and owner is not cache:
            _detach(owner, self.static)
        self.static.load_from(cache)
        cache.states = list(self.static.states)
        cache.conv = dict(self.static.conv)
        cache.static = True  # short convs write their kept inputs in place, as on the static cache
        cache.counts_on_host = True  # eager steps on it advance the host counters too
        cache.step_graph = self
        self.owner = weakref.ref(cache)

    def release(self) -> None:
        owner = self.owner() if self.owner is not None else None
        if owner is not None:
            _detach(owner, self.static)
        self.owner = self.graph = self.logits = None


def _holds(cache: GLAStateCache, static: GLAStateCache) -> bool:
    return (len(cache.states) == len(static.states) and all(a is b for a, b in zip(cache.states, static.states))
            and cache.conv.keys() == static.conv.keys() and all(cache.conv[k] is t for k, t in static.conv.items()))


def _detach(cache: GLAStateCache, static: GLAStateCache) -> None:
    """Give ``cache`` copies of whichever of ``static``'s tensors it holds (another cache adopts them next)."""
    mine = {id(s) for s in static.states}
    cache.states = [State(s.data.clone(), None if s.scale is None else s.scale.clone(), s.format, s.n_stores)
                    if s is not None and id(s) in mine else s for s in cache.states]
    shared = {id(t) for t in static.conv.values()}
    cache.conv = {k: t.clone() if id(t) in shared else t for k, t in cache.conv.items()}
    cache.static = cache.counts_on_host = False
    cache.step_graph = None
