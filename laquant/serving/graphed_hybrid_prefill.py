"""A transformers hybrid's fresh prefill replayed as a CUDA graph: its time to first token.

An eager prefill of a quantized hybrid is bound by the host up to a few thousand tokens: ~25 Triton launches a layer,
each 21-32 us of the lent H200s' host time, against a GPU that finishes a 1K-token layer sooner (Granite 4's 1K
prefill: 11,001 tok/s on the wall clock against bf16's 18,207 while its kernels took 0.85x bf16's GPU time,
``eval/results/fused_moe_h200/``). :class:`HybridPrefillGraphs` captures the prefill once per token-count bucket
(:func:`~laquant.serving.graphed_prefill.bucket_for`) and batch size and replays it.

How: the prompt is padded **on the left** to its bucket, with the padding masked as transformers' padded batches are
(``attention_mask`` 0 there, each sequence's ``position_ids`` counting its real tokens from 0). laquant's mixers take
left padding as no input, so a sequence starts from zeros at its first real token as it would alone (the recurrent
states, the short convs' kept inputs, the softmax layers' keys at positions ``0 .. T-1``). After a replay the cache is
copied out of the graph's memory with the padding's keys and values dropped: a cache of ``T`` tokens, as an eager
prefill of the prompt gives it, that decodes without any mask (CPU-tested for every family against the unpadded
prefill, ``tests/test_graphed_hybrid_prefill.py``).

transformers' mask builders skip the explicit mask where they can read the device and see no padding, and take a
stream capture for tracing, where they cannot. Every run here (the capture, its warm-ups and the eager check) builds
its masks as under tracing (:func:`_traced_masks`), so all of them run the same attention kernels.

Numerics: an eager prefill's up to rounding (the GEMMs see ``bucket`` rows, the chunked kernels another chunk
alignment, the attention an explicit mask). A new capture is checked once against the same padded prefill run
eagerly, bit for bit on the logits and every state (transformers' code runs inside, and may decide at capture what
it decides per call eagerly); a capture that differs or fails turns the model's graphed prefills off, warned, and
its prefills run eagerly. What it covers: the hybrids whose decode steps laquant graphs
(:func:`laquant.generate.is_graphable`), on CUDA, without gradients, no quantized linear with per-tensor activation
scales, no forward hooks but laquant's (:func:`~laquant.serving.graphed_forward.forward_graphable`), prompts of at
most :data:`laquant.generate.MAX_GRAPHED_PREFILL` tokens; prompts of several lengths padded on the left with their
mask too (their own padding stays in the cache, as an eager padded prefill keeps it).

Callers: :func:`laquant.generate.prefill` (``generate(..., graphed_prefill=True)``, ``laquant eval speed``'s graphed
prefill column), and transformers' ``generate`` where ``model.laquant_graph_prefill`` (or ``LAQUANT_GRAPH_PREFILL=1``)
is on (:func:`hybrid_generate_prefill`, through the forward laquant's adapter wraps; ``laquant eval lm-eval --graphed``
turns it on for its generation tasks): the replay's cache is copied into the cache object ``generate`` passed.
"""

from __future__ import annotations

import contextlib
import copy
import os
import weakref
from collections import OrderedDict

import torch

from laquant.serving.graphed_prefill import bucket_for


def graph_prefill_enabled(model) -> bool:
    """Whether transformers' ``generate`` on ``model`` replays its prefills (:func:`hybrid_generate_prefill`):
    ``model.laquant_graph_prefill`` where set, else ``LAQUANT_GRAPH_PREFILL=1``. Off by default: a capture costs about
    four eager prefills, so it pays for prompts of one bucket and batch size served repeatedly."""
    flag = getattr(model, "laquant_graph_prefill", None)
    return bool(flag) if flag is not None else os.environ.get("LAQUANT_GRAPH_PREFILL", "0") == "1"


def hybrid_prefill_graphable(model, walk=None) -> bool:
    """Whether ``model``'s fresh prefills can replay padded: a transformers hybrid laquant adapted, whose decode steps
    laquant graphs, with no per-tensor activation scales and no forward hooks but laquant's. ``walk``: its modules as
    walked before (:class:`~laquant.serving.graphed_forward._Walk`), else walked now."""
    from laquant.adapters.hybrid import is_adapted_hybrid
    from laquant.serving.graphed_forward import _Walk

    return (is_adapted_hybrid(model) and getattr(model, "_laquant_positions_hook", False)
            and (walk or _Walk(model)).graphable())


@contextlib.contextmanager
def _traced_masks():
    """transformers' mask builders (``masking_utils``) as under a stream capture, also outside one: an explicit mask
    from the padding, never a device read to see whether it could be skipped."""
    from transformers import masking_utils

    saved = masking_utils.is_tracing
    masking_utils.is_tracing = _tracing
    try:
        yield
    finally:
        masking_utils.is_tracing = saved


def _tracing(tensor=None):
    return True


def _kv_tensors(cache) -> list[torch.Tensor]:
    """The keys and values tensors of ``cache``'s softmax layers (:func:`~laquant.models.static_hybrid.kv_layers`)."""
    from laquant.models.static_hybrid import kv_layers

    return [t for kv in kv_layers(cache).values() for t in kv]


def _all_tensors(logits, cache) -> list[torch.Tensor]:
    """What the faithfulness check compares: the logits, the states (and their scales) and conv inputs, the keys and
    values."""
    from laquant.models.cache import state_store

    store = state_store(cache)
    states = [t for s in store.states.values() for t in (s.data, s.scale) if t is not None]
    return [logits, *states, *store.conv.values(), *_kv_tensors(cache)]


class _Capture:
    """One bucket's static inputs (token ids, mask and positions, padded on the left) and its captured prefill
    (``graph`` None: each replay re-runs it eagerly on the same tensors, the CPU tests' path). The warm-ups and the
    capture run on the first prompt's tokens: on all-padding inputs a fused MoE router's first-use check
    (:mod:`laquant.models.fused_moe`) would see every token tie."""

    def __init__(self, model, bucket: int, input_ids: torch.Tensor, padding: torch.Tensor | None, use_graph: bool,
                 pool=None):
        self._model, self.bucket = weakref.ref(model), bucket  # the model holds its captures: no cycle
        device, batch = next(model.parameters()).device, input_ids.shape[0]
        self.ids = torch.zeros(batch, bucket, dtype=torch.long, device=device)
        self.mask = torch.zeros(batch, bucket, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, bucket, dtype=torch.long, device=device)
        self.fill(input_ids, padding)
        self.graph = None
        if use_graph:
            from laquant.generate import capture_graph, warm_up_outside_capture

            warm_up_outside_capture(self.run_eagerly)
            self.graph, (self.logits, self.cache) = capture_graph(self.run_eagerly, pool)

    @torch.no_grad()  # as the eager prefill: with gradients on, the model would take its reference ops
    def run_eagerly(self):
        """``(logits [B, vocab] of the last position, cache)`` of the static inputs, eagerly."""
        from laquant.adapters import cache_kwargs, new_cache, returned_cache

        model = self._model()
        cache = new_cache(model)
        with _traced_masks():
            out = model(input_ids=self.ids, attention_mask=self.mask, position_ids=self.positions,
                        **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], returned_cache(out)

    def fill(self, input_ids: torch.Tensor, padding: torch.Tensor | None = None) -> None:
        """``input_ids [B, T]`` into the static inputs, padded on the left; ``padding`` (bool ``[B, T]``, False at a
        prompt's own padding, on the left): those positions are masked too, and each sequence's positions count its
        real tokens (:func:`laquant.generate._padding_kwargs`)."""
        T = input_ids.shape[1]
        pad = self.bucket - T
        self.ids[:, :pad].zero_()
        self.ids[:, pad:].copy_(input_ids)
        self.mask[:, :pad].zero_()
        self.positions[:, :pad].fill_(1)  # any value: a padded position is no input (as laquant.generate's)
        if padding is None:
            self.mask[:, pad:].fill_(1)
            self.positions[:, pad:].copy_(torch.arange(T, device=self.positions.device))
        else:
            self.mask[:, pad:].copy_(padding)
            self.positions[:, pad:].copy_((padding.long().cumsum(-1) - 1).masked_fill(~padding, 1))

    def replay(self, input_ids: torch.Tensor, padding: torch.Tensor | None = None):
        """``(logits, cache)`` of ``input_ids`` (``padding``: as :meth:`fill` takes it), in the graph's memory (valid
        until the next replay)."""
        self.fill(input_ids, padding)
        if self.graph is None:
            return self.run_eagerly()
        self.graph.replay()
        return self.logits, self.cache

    def copied_out(self, logits: torch.Tensor, cache, tokens: int):
        """``(logits, cache)`` out of the graph's memory: the cache of the prompt's ``tokens`` tokens alone, the
        padding's keys and values dropped (every other tensor and setting of the cache copied as it is)."""
        from laquant.models.cache import state_store

        drop = self.bucket - tokens
        memo = {id(t): t[..., drop:, :].clone() for t in _kv_tensors(cache)}
        out = copy.deepcopy(cache, memo)
        state_store(out).seen_tokens = tokens
        return logits.clone(), out


class HybridPrefillGraphs:
    """Fresh prefills of a transformers hybrid ``model`` replayed per token-count bucket and batch size (captured on
    first use), of at most ``max_tokens`` tokens; ``use_graph`` False re-runs them eagerly on the same static tensors
    (CPU, tests). Called as :class:`~laquant.serving.graphed_prefill.GraphedPrefill` is, on an empty cache. At most
    ``max_captures`` stay captured (each holds its bucket's activations); the least recently used is freed first."""

    def __init__(self, model, max_tokens: int, use_graph: bool = True, max_captures: int = 8):
        self._model, self.max_tokens, self.use_graph = weakref.ref(model), max_tokens, use_graph
        self.max_captures = max_captures
        self.captures: OrderedDict = OrderedDict()  # least recently used first
        self.refused: dict = {}  # key -> why its capture ran out of memory (that key's prefills run eagerly)
        self.failure: str | None = None  # a capture failed otherwise, or replayed other numbers: all run eagerly
        self.pool = None
        self.walk = None  # the model's modules, walked at the first check (graphed_forward._Walk)

    @property
    def model(self):
        return self._model()

    def model_graphable(self) -> bool:
        """:func:`hybrid_prefill_graphable` of the model, its modules walked once (a capture holds the modules it saw:
        a model whose modules are replaced must release its graphs, as laquant's quantize and ``_apply`` do); the
        hooks, which come and go, checked at every call."""
        from laquant.serving.graphed_forward import _Walk

        self.walk = self.walk or _Walk(self.model)
        return hybrid_prefill_graphable(self.model, self.walk)

    def __call__(self, fresh_cache, input_ids: torch.Tensor, padding: torch.Tensor | None = None):
        """``(logits [B, 1, vocab], cache)`` of ``input_ids [B, T]`` (``padding``: prompts of several lengths padded
        on the left, bool ``[B, T]``, False at the padding: the cache keeps their padded positions, as the eager
        prefill's does), or None where this prefill runs eagerly (a failure before, a refused bucket, a capture that
        failed or replayed other numbers: warned once)."""
        from laquant.generate import weights_key
        from laquant.models.cache import state_store

        store = state_store(fresh_cache)
        if store is not None and (store.states or store.seen_tokens) or _kv_tensors(fresh_cache):
            raise ValueError("a graphed hybrid prefill starts from an empty cache")
        model = self.model
        if self.failure is not None or model is None or input_ids.shape[1] > self.max_tokens:
            return None
        setting = model.get_experts_implementation() if hasattr(model, "get_experts_implementation") else {}
        key = (input_ids.shape[0], bucket_for(input_ids.shape[1]), tuple(sorted(setting.items())), weights_key(model))
        if key in self.refused:
            return None
        capture = self.captures.get(key)
        if capture is None:
            capture = self._capture(key, input_ids, padding)
            if capture is None:
                return None
            logits, cache = capture.replay(input_ids, padding)
            if self.use_graph and not self._faithful(capture, logits, cache):
                return None
        else:
            self.captures.move_to_end(key)
            logits, cache = capture.replay(input_ids, padding)
        logits, cache = capture.copied_out(logits, cache, input_ids.shape[1])
        return logits[:, None], cache

    def _capture(self, key, input_ids: torch.Tensor, padding: torch.Tensor | None) -> _Capture | None:
        while len(self.captures) >= self.max_captures:
            self.captures.popitem(last=False)
        if not self.captures:  # a pool dies with the last graph that used it (a failed capture's included):
            self.pool = None  # capturing into its handle again trips an assert in PyTorch's caching allocator
        if self.use_graph and self.pool is None:  # one replay's outputs are copied out before the next
            self.pool = torch.cuda.graph_pool_handle()
        try:
            with torch.inference_mode(False):  # normal tensors: later replays copy into them in place
                capture = _Capture(self.model, key[1], input_ids, padding, self.use_graph, self.pool)
        except RuntimeError as exc:  # an op the capture refuses: slower, never wrong, so eagerly
            from laquant.generate import capture_failure

            self._give_up(key, capture_failure(exc), isinstance(exc, torch.OutOfMemoryError),
                          "a hybrid's prefill could not be captured as a CUDA graph")
            return None
        self.captures[key] = capture
        return capture

    def _faithful(self, capture: _Capture, logits: torch.Tensor, cache) -> bool:
        """Whether a new capture's replay equals the same padded prefill run eagerly, bit for bit."""
        replayed = [t.clone() for t in _all_tensors(logits, cache)]
        try:
            eager = _all_tensors(*capture.run_eagerly())
        except torch.OutOfMemoryError as exc:
            key = next(k for k, c in self.captures.items() if c is capture)
            del self.captures[key]
            self._give_up(key, f"{type(exc).__name__}: {exc}", True, "a hybrid's prefill capture could not be checked")
            return False
        if len(eager) == len(replayed) and all(a.shape == b.shape and torch.equal(a, b)
                                               for a, b in zip(replayed, eager)):
            return True
        self.captures.clear()
        self._give_up(None, "a replay differed from the same prefill run eagerly", False,
                      f"{type(self.model).__name__}'s prefill does not replay as a CUDA graph")
        return False

    def _give_up(self, key, why: str, out_of_memory: bool, what: str) -> None:
        from laquant.serving.graphed_forward import give_up

        give_up(self, key, why, out_of_memory, what, "prefills")


def hybrid_generate_prefill(model, args: tuple, kwargs: dict):
    """The prefill transformers' ``generate`` hands a hybrid's forward, as a replay (:class:`HybridPrefillGraphs`, the
    model's :func:`laquant.generate.prefill_graphs`), or None where it runs eagerly: graphed prefills off
    (:func:`graph_prefill_enabled`), not CUDA, gradients on, a cache that holds anything already, inputs other than
    token ids with their mask and positions (as ``generate`` makes them from the mask: each sequence counts its real
    tokens), more logits than the last position's, or a model or prompt :func:`laquant.generate.graphed_prefill_refusal`
    refuses. The replay's cache is copied into the caller's cache object, which ``generate`` keeps."""
    from laquant.generate import graphed_prefill_refusal, prefill_graphs
    from laquant.models.cache import passed_cache, state_store
    from laquant.serving.graphed_forward import _capturing, _on_graph_device

    ids = kwargs.get("input_ids", args[0] if args else None)
    cache = passed_cache(kwargs)
    extra = set(kwargs) - {"input_ids", "attention_mask", "position_ids", "logits_to_keep", "use_cache", "return_dict",
                           "cache", "past_key_values", "cache_params", "cache_position"}
    if (len(args) > 1 or extra or not graph_prefill_enabled(model) or not isinstance(ids, torch.Tensor)
            or ids.dim() != 2 or ids.shape[1] < 2 or not _on_graph_device(ids) or kwargs.get("logits_to_keep") != 1
            or cache is None or not kwargs.get("use_cache", True) or model.training or torch.is_grad_enabled()
            or _capturing()):
        return None
    store = state_store(cache)
    if store.states or store.seen_tokens or _kv_tensors(cache):
        return None
    padding = _left_padding(ids, kwargs.get("attention_mask"), kwargs.get("position_ids"))
    if padding is False or graphed_prefill_refusal(model, ids.shape[1]) is not None:
        return None
    from laquant.adapters import new_cache

    graphs = prefill_graphs(model)
    replayed = graphs(new_cache(model), ids, padding) if graphs.failure is None else None
    if replayed is None or not _fill(cache, replayed[1]):
        return None
    from laquant.models.graphed_step import OUTPUT_CACHE_FIELD
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return CausalLMOutputWithPast(logits=replayed[0], **{OUTPUT_CACHE_FIELD: cache})


def _left_padding(ids: torch.Tensor, mask, positions):
    """The prompts' padding (bool ``[B, T]``, None: none) where ``mask`` pads them on the left and ``positions`` (None:
    ``arange``) count each sequence's real tokens from 0, as :meth:`_Capture.fill` does, else False (this call runs
    eagerly). Reads the device."""
    from laquant.errors import LaquantError
    from laquant.generate import _left_padding as checked_padding

    try:
        padding = checked_padding(ids, mask)
    except LaquantError:  # not padded on the left
        return False
    if positions is not None:  # a padded position's own is no input (transformers 5.25 gives it 0, laquant 1)
        real = torch.ones_like(ids, dtype=torch.bool) if padding is None else padding
        want = real.long().cumsum(-1) - 1
        if tuple(positions.shape) != tuple(ids.shape) or not bool((positions == want)[real].all()):
            return False
    return padding


def _fill(cache, replayed) -> bool:
    """Copy a replay's copied-out cache into ``cache`` (the caller's, of the same layer classes): its layers' keys and
    values, and the linear layers' state store. False (nothing copied) where the layers differ."""
    from laquant.models.cache import state_store

    mine, theirs = getattr(cache, "layers", None), getattr(replayed, "layers", None)
    if mine is None or theirs is None or len(mine) != len(theirs) or any(
            type(a) is not type(b) for a, b in zip(mine, theirs)):
        return False
    for a, b in zip(mine, theirs):
        a.__dict__.update(b.__dict__)
    cache.laquant_states = state_store(replayed)
    return True
