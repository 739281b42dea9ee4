"""A resumed prefill replayed as a CUDA graph: the follow-up request's time to first token.

A follow-up request resumes from a cached snapshot and runs only its new tokens: tens to a few
hundred. On a 24-layer model that eager prefill costs tens of milliseconds of Python and kernel
launches for a few milliseconds of GPU work (``eval/results/serving_h100.md``), so the prefix cache
saved little time. This module captures that prefill once per token-count bucket (64, 128, 256, ...)
on static tensors and replays it:

* the request's tokens are padded to the bucket; the padding is made a no-op for the state by the
  cache's ``token_mask`` (zero keys and zero log-decays: the recurrent mixers multiply them by it, so
  neither GLA's update nor the delta rule's moves the state), and the outputs of the padded positions
  are never read (causal: they cannot change the real ones);
* the snapshot is copied into the graph's static input states; a resumed prefill's final store is
  always its store 1 (a restored snapshot counts as store 0), so the store count and the cache's seed
  that the kernels take as launch arguments are the same at every replay;
* the next-token logits are those of the last real position (a gather by a static index, then
  ``lm_head`` on that one row); the final states are copied out of the graph's memory into a fresh
  cache that continues the sequence.

What it covers: laquant's own models on CUDA (GLA, Gated DeltaNet, DeltaNet), with or without short
convs (the kept inputs are those that end at the last real token), recurrent layers only (no softmax
``attn`` layers, whose keys and values grow), no round trip of the state inside the prefill
(``prefill_roundtrip``), requests that resume from a snapshot and add fewer tokens than a block (so no
new snapshot is due). Anything else runs
eagerly, as before. Numerics: the eager resumed prefill's up to rounding: the padding lengthens the
GEMMs' M (a bf16 GEMM may then take other tiles; the int8 ones are exact) and the chunk kernels' last
chunk holds zeros where the eager call masks its loads out.
"""

from __future__ import annotations

import warnings

import torch

from laquant.kernels.common.state import State
from laquant.models.cache import GLAStateCache, state_layout

MIN_BUCKET = 64


def bucket_for(tokens: int) -> int:
    """The token-count bucket a request of ``tokens`` new tokens is padded to (a power of two >= 64)."""
    return max(MIN_BUCKET, 1 << max(0, tokens - 1).bit_length())


def model_graphable(model) -> bool:
    """Whether ``model``'s resumed prefills can be replayed: laquant's GLA with recurrent layers only
    (no softmax ``attn`` layers, whose keys and values grow) and no state round trip inside the prefill."""
    from laquant.models import GLAForCausalLM
    from laquant.models.delta_net import DeltaNet
    from laquant.models.gated_deltanet import GatedDeltaNet
    from laquant.models.gla import GatedLinearAttention

    if not isinstance(model, GLAForCausalLM):  # GatedDeltaNetForCausalLM and DeltaNetForCausalLM too
        return False
    mixers = [layer.attn for layer in model.model.layers]
    return all(isinstance(m, (GatedLinearAttention, GatedDeltaNet, DeltaNet))
               and not (m.prefill_roundtrip and not m.state_quantizer.is_plain_fp32) for m in mixers)


def graphs_on_this_device(model) -> bool:
    """Whether a prefix cache of ``model`` replays short resumed prefills by default: a CUDA model
    that :func:`model_graphable` covers."""
    return next(model.parameters()).is_cuda and model_graphable(model)


def graphable(model, cache: GLAStateCache) -> bool:
    """Whether a resumed prefill of ``model`` from ``cache`` (restored from a snapshot) can be replayed."""
    if not isinstance(cache, GLAStateCache) or cache.kv:
        return False
    if any(s is None for s in cache.states) or {s.n_stores for s in cache.states} != {0}:
        return False
    return model_graphable(model)


class _Capture:
    """One bucket's static tensors and its captured prefill (``graph`` None: each replay re-runs
    the prefill eagerly on the same tensors, which is how the CPU tests exercise everything but
    the capture itself)."""

    def __init__(self, model, layout: GLAStateCache, bucket: int, use_graph: bool):
        self.model, self.bucket = model, bucket
        device = layout.states[0].data.device
        self.ids = torch.zeros(1, bucket, dtype=torch.long, device=device)
        self.mask = torch.zeros(1, bucket, dtype=torch.float32, device=device)
        self.last = torch.zeros(1, dtype=torch.long, device=device)
        self.seed = layout.seed
        self.inputs = [State(s.data.clone(), None if s.scale is None else s.scale.clone(), s.format, 0)
                       for s in layout.states]
        self.conv_inputs = {key: t.clone() for key, t in layout.conv.items()}  # short convs' last inputs
        self.graph = None
        if use_graph:
            from laquant.generate import capture_graph, warm_up_outside_capture

            warm_up_outside_capture(self._run)
            self.graph, (self.logits, self.outputs) = capture_graph(self._run)

    @torch.no_grad()  # as the eager prefill: with gradients on, the model would take its reference ops
    def _run(self):
        cache = GLAStateCache(len(self.inputs), self.seed)
        cache.states = list(self.inputs)  # read in place; the mixers put their new states beside them
        cache.conv = dict(self.conv_inputs)
        cache.token_mask = self.mask
        hidden = self.model.model(self.ids, cache)
        logits = self.model.lm_head(hidden.index_select(1, self.last))
        return logits, (cache.states, cache.conv)

    def replay(self, restored: GLAStateCache, suffix: torch.Tensor):
        """``(logits [1, 1, vocab], cache)`` of ``suffix`` (``[1, T]``, T <= bucket) after ``restored``."""
        T = suffix.shape[1]
        for mine, theirs in zip(self.inputs, restored.states):
            mine.data.copy_(theirs.data)
            if mine.scale is not None:
                mine.scale.copy_(theirs.scale)
        for key, t in self.conv_inputs.items():
            t.copy_(restored.conv[key])
        self.ids.zero_()
        self.ids[:, :T].copy_(suffix)
        self.mask.zero_()
        self.mask[:, :T] = 1.0
        self.last.fill_(T - 1)
        if self.graph is not None:
            self.graph.replay()
            logits, (states, conv) = self.logits, self.outputs
        else:
            logits, (states, conv) = self._run()
        out = GLAStateCache(len(states), self.seed)
        out.states = [State(s.data.clone(), None if s.scale is None else s.scale.clone(), s.format, s.n_stores)
                      for s in states]
        out.conv = {key: t.clone() for key, t in conv.items()}
        out.seen_tokens = restored.seen_tokens + T
        return logits.clone(), out


class GraphedPrefill:
    """Resumed prefills of ``model`` replayed per token-count bucket (captured on first use, for
    each state layout and seed); ``use_graph`` False re-runs them eagerly on the same static
    tensors (CPU, tests)."""

    def __init__(self, model, max_tokens: int, use_graph: bool = True):
        self.model, self.max_tokens, self.use_graph = model, max_tokens, use_graph
        self.captures: dict = {}
        self.failure: str | None = None  # why a capture failed; then every prefill runs eagerly

    def covers(self, cache: GLAStateCache, tokens: int) -> bool:
        """Whether a resumed prefill of ``tokens`` new tokens from ``cache`` replays here (one new
        token takes the decode kernel, whose stores are keyed differently: it stays eager)."""
        return (self.failure is None and 1 < tokens <= self.max_tokens and graphable(self.model, cache)
                and (cache.states[0].data.is_cuda or not self.use_graph))

    def __call__(self, restored: GLAStateCache, suffix: torch.Tensor):
        """``(logits, cache)`` of ``suffix`` after ``restored``, or None where the bucket's prefill
        could not be captured (the reason in :attr:`failure`, warned once): the caller runs it eagerly."""
        bucket = bucket_for(suffix.shape[1])
        layout = state_layout(restored.states)
        convs = tuple(sorted((key, tuple(t.shape), t.dtype) for key, t in restored.conv.items()))
        key = (bucket, layout, convs, restored.seed)
        capture = self.captures.get(key)
        if capture is None:
            try:
                capture = _Capture(self.model, restored, bucket, self.use_graph)
            except RuntimeError as exc:  # an op the capture refuses: slower, never wrong, so run eagerly
                self.failure = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"laquant: a resumed prefill could not be captured as a CUDA graph ({self.failure}); "
                              "prefills of this prefix cache run eagerly", stacklevel=3)
                return None
            self.captures[key] = capture
        return capture.replay(restored, suffix)
