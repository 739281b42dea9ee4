"""A prefill replayed as a CUDA graph: a request's time to first token.

Two kinds of prefill replay here, both captured once per token-count bucket (64, 128, 256, 512, 1,024,
then multiples of 1,024) and batch size on static tensors:

* a **resumed** prefill (:mod:`laquant.serving.prefix_cache`): a follow-up request resumes from a
  cached snapshot and runs only its new tokens, tens to a few hundred. On a 24-layer model that eager
  prefill costs tens of milliseconds of Python and kernel launches for a few milliseconds of GPU work
  (``eval/results/serving_h100.md``), so the prefix cache saved little time without it;
* a **fresh** prefill, from an empty cache (:func:`laquant.generate.generate`'s ``graphed_prefill``,
  ``laquant eval speed``'s e2e suite): an eager 4,096-token prefill of a 1.37B GLA is bound by the host's
  Python and launches, not by its ~17 ms of GPU work (``eval/results/fast_launch_h200/``).

How:

* the request's tokens are padded to the bucket; the padding is made a no-op for the state by the
  cache's ``token_mask`` (zero keys and zero log-decays: the recurrent mixers multiply them by it, so
  neither GLA's update nor the delta rule's moves the state), and the outputs of the padded positions
  are never read (causal: they cannot change the real ones);
* a resumed prefill's snapshot is copied into the graph's static input states; its final store is
  always its store 1 (a restored snapshot counts as store 0), and a fresh prefill's is its first, so the
  store count and the cache's seed that the kernels take as launch arguments are the same at every
  replay;
* the next-token logits are those of the last real position (a gather by a static index, then
  ``lm_head`` on that one row); the final states are copied out of the graph's memory into a fresh
  cache that continues the sequence. The captures of one :class:`GraphedPrefill` share one memory pool.

What it covers: laquant's own models on CUDA (GLA, Gated DeltaNet, DeltaNet), with or without short
convs (the kept inputs are those that end at the last real token), recurrent layers only (no softmax
``attn`` layers, whose keys and values grow), no round trip of the state inside the prefill
(``prefill_roundtrip``), no per-tensor activation scales (the padding would move them); resumed
requests that add fewer tokens than a block (so no new snapshot is due). Anything else runs eagerly,
as before. Numerics: the eager prefill's up to rounding: the
padding lengthens the GEMMs' M (a bf16 GEMM may then take other tiles; the int8 ones are exact) and
the chunk kernels' last chunk holds zeros where the eager call masks its loads out. A fresh prompt of
exactly a bucket's length runs the eager prefill's kernels on the same shapes (its mask all ones).
A capture costs about three eager prefills of the bucket (two warm-ups, then the capture): it pays from
the fourth prompt of a bucket on.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from laquant.kernels.common.state import State
from laquant.models.cache import GLAStateCache, state_layout

MIN_BUCKET = 64
# above this, buckets are its multiples (a 4,100-token prompt pads to 5,120 tokens, not 8,192)
LINEAR_BUCKETS_FROM = 1024


def bucket_for(tokens: int) -> int:
    """The token-count bucket a request of ``tokens`` new tokens is padded to: a power of two >= 64 up
    to 1,024, then a multiple of 1,024."""
    if tokens > LINEAR_BUCKETS_FROM:
        return -(-tokens // LINEAR_BUCKETS_FROM) * LINEAR_BUCKETS_FROM
    return max(MIN_BUCKET, 1 << max(0, tokens - 1).bit_length())


def model_graphable(model) -> bool:
    """Whether ``model``'s prefills can be replayed padded: laquant's GLA with recurrent layers only
    (no softmax ``attn`` layers, whose keys and values grow), no state round trip inside the prefill, and
    no quantized linear with per-tensor activations (one scale over every token of the call: the padding's
    tokens would move the real ones')."""
    from laquant.models import GLAForCausalLM
    from laquant.models.delta_net import DeltaNet
    from laquant.models.gated_deltanet import GatedDeltaNet
    from laquant.models.gla import GatedLinearAttention
    from laquant.quant.modules import QuantLinear

    if not isinstance(model, GLAForCausalLM):  # GatedDeltaNetForCausalLM and DeltaNetForCausalLM too
        return False
    mixers = [layer.attn for layer in model.model.layers]
    return (all(isinstance(m, (GatedLinearAttention, GatedDeltaNet, DeltaNet))
                and not (m.prefill_roundtrip and not m.state_quantizer.is_plain_fp32) for m in mixers)
            and not any(isinstance(m, QuantLinear) and m.act_granularity == "per_tensor" for m in model.modules()))


def mixers_key(model) -> tuple:
    """What a capture takes from the mixers' state quantizers besides the states' layout (:func:`quantizer_key`)."""
    return tuple(quantizer_key(layer.attn.state_quantizer) for layer in model.model.layers)


def quantizer_key(q) -> tuple:
    """What a capture takes from a state quantizer: its format, rounding, renormalisation interval and static scale
    (by storage)."""
    return q.format.name, q.rounding, q.renorm_interval, None if q.static_scale is None else q.static_scale.data_ptr()


def graphs_on_this_device(model) -> bool:
    """Whether a prefix cache of ``model`` replays short prefills by default: a CUDA model
    that :func:`model_graphable` covers."""
    return next(model.parameters()).is_cuda and model_graphable(model)


def is_fresh(cache) -> bool:
    """Whether ``cache`` is an empty :class:`GLAStateCache` (no state, no conv input, nothing seen or pending)."""
    return (isinstance(cache, GLAStateCache) and cache.seen_tokens == 0 and not cache.kv and not cache.conv
            and all(s is None for s in cache.states) and cache.pending is None and cache.checkpoints is None
            and cache.token_mask is None and not cache.static)


def cache_graphable(cache) -> bool:
    """Whether a prefill from ``cache`` can be replayed, as far as the cache goes: ``cache`` empty (a fresh prefill)
    or restored from a snapshot (a resumed one)."""
    return is_fresh(cache) or (isinstance(cache, GLAStateCache) and not cache.kv
                               and all(s is not None for s in cache.states)
                               and {s.n_stores for s in cache.states} == {0})


class _Capture:
    """One bucket's static tensors and its captured prefill (``graph`` None: each replay re-runs
    the prefill eagerly on the same tensors, which is how the CPU tests exercise everything but
    the capture itself). ``layout``: the restored cache a resumed prefill starts from, or an empty one."""

    def __init__(self, model, layout: GLAStateCache, bucket: int, batch: int, use_graph: bool, pool=None):
        self._model, self.bucket = weakref.ref(model), bucket  # a model may hold its captures: no cycle
        device = next(model.parameters()).device
        self.ids = torch.zeros(batch, bucket, dtype=torch.long, device=device)
        self.mask = torch.zeros(batch, bucket, dtype=torch.float32, device=device)
        self.last = torch.zeros(1, dtype=torch.long, device=device)
        self.seed, self.layers = layout.seed, len(layout.states)
        self.inputs = None if is_fresh(layout) else [
            State(s.data.clone(), None if s.scale is None else s.scale.clone(), s.format, 0) for s in layout.states]
        self.conv_inputs = {key: t.clone() for key, t in layout.conv.items()}  # short convs' last inputs
        self.graph = None
        if use_graph:
            from laquant.generate import capture_graph, warm_up_outside_capture

            warm_up_outside_capture(self._run)
            self.graph, (self.logits, self.outputs) = capture_graph(self._run, pool)

    @property
    def model(self):
        return self._model()

    @torch.no_grad()  # as the eager prefill: with gradients on, the model would take its reference ops
    def _run(self):
        cache = GLAStateCache(self.layers, self.seed)
        if self.inputs is not None:
            cache.states = list(self.inputs)  # read in place; the mixers put their new states beside them
        cache.conv = dict(self.conv_inputs)
        cache.token_mask = self.mask
        hidden = self.model.model(self.ids, cache)
        logits = self.model.lm_head(hidden.index_select(1, self.last))
        return logits, (cache.states, cache.conv)

    def replay(self, restored: GLAStateCache, suffix: torch.Tensor):
        """``(logits [B, 1, vocab], cache)`` of ``suffix`` (``[B, T]``, T <= bucket) after ``restored``."""
        T = suffix.shape[1]
        for mine, theirs in zip(self.inputs or (), restored.states):
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
    """Prefills of ``model`` replayed per token-count bucket and batch size (captured on first use, for
    each state layout and seed), of at most ``max_tokens`` tokens; ``use_graph`` False re-runs them
    eagerly on the same static tensors (CPU, tests)."""

    def __init__(self, model, max_tokens: int, use_graph: bool = True):
        self._model, self.max_tokens, self.use_graph = weakref.ref(model), max_tokens, use_graph
        self.captures: dict = {}
        self.refused: dict = {}  # key -> why its capture ran out of memory (that key's prefills run eagerly)
        self.failure: str | None = None  # why a capture failed otherwise; then every prefill runs eagerly
        self.pool = None  # the captures' shared memory pool (made at the first capture)
        self._model_graphable: bool | None = None  # model_graphable, walked once: it reads every module (~1 ms)

    @property
    def model(self):
        return self._model()

    def model_graphable(self) -> bool:
        """:func:`model_graphable` of the model, computed at the first call (a capture holds the modules it saw: a
        model whose modules are replaced must release its graphs, as laquant's quantize and ``_apply`` do)."""
        if self._model_graphable is None:
            self._model_graphable = model_graphable(self.model)
        return self._model_graphable

    def covers(self, cache: GLAStateCache, tokens: int) -> bool:
        """Whether a prefill of ``tokens`` tokens from ``cache`` replays here: from an empty cache, or a
        resumed one of several tokens (one new token takes the decode kernel, whose stores are keyed
        differently: it stays eager)."""
        fresh = is_fresh(cache)
        return (self.failure is None and (1 if fresh else 2) <= tokens <= self.max_tokens
                and cache_graphable(cache) and self.model_graphable()
                and (next(self.model.parameters()).is_cuda or not self.use_graph))

    def __call__(self, restored: GLAStateCache, suffix: torch.Tensor):
        """``(logits [B, 1, vocab], cache)`` of ``suffix [B, T]`` after ``restored`` (restored from a
        snapshot, or empty), or None where the bucket's prefill could not be captured (the reason in
        :attr:`refused` for an out-of-memory capture, else in :attr:`failure`; warned once): the caller runs it
        eagerly."""
        bucket = bucket_for(suffix.shape[1])
        layout = "fresh" if is_fresh(restored) else state_layout(restored.states)
        convs = tuple(sorted((key, tuple(t.shape), t.dtype) for key, t in restored.conv.items()))
        from laquant.generate import weights_key

        key = (bucket, suffix.shape[0], layout, convs, restored.seed, mixers_key(self.model), weights_key(self.model))
        if key in self.refused:
            return None
        capture = self.captures.get(key)
        if capture is None:
            if not self.captures:  # a pool dies with the last graph that used it (a failed capture's included):
                self.pool = None  # capturing into its handle again trips an assert in PyTorch's caching allocator
            if self.use_graph and self.pool is None:  # safe: one replay's outputs are copied out before the next
                self.pool = torch.cuda.graph_pool_handle()
            try:
                # normal tensors even under torch.inference_mode: later replays copy into them in place
                with torch.inference_mode(False):
                    capture = _Capture(self.model, restored, bucket, suffix.shape[0], self.use_graph, self.pool)
            except RuntimeError as exc:  # an op the capture refuses: slower, never wrong, so run eagerly
                why = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, torch.OutOfMemoryError):  # a smaller bucket or batch may still fit
                    self.refused[key] = why
                    scope = f"prefills of {suffix.shape[0]} x {bucket} tokens run eagerly"
                else:
                    self.failure = why
                    scope = "these prefills run eagerly"
                warnings.warn(f"laquant: a prefill could not be captured as a CUDA graph ({why}); {scope}",
                              stacklevel=3)
                return None
            self.captures[key] = capture
        return capture.replay(restored, suffix)
