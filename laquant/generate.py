"""``laquant.generate``: a decode loop for laquant's models, CUDA-graphed on the GPU.

:func:`generate` prefills the prompt (eagerly, or with ``graphed_prefill=True`` as a CUDA graph replayed per
token-count bucket: :func:`prefill`), then decodes token by token. On CUDA (``graphed=None``
or ``True``) the model decodes on a **static cache** and **one CUDA graph per step**:

* laquant's ``GLAForCausalLM`` (and Gated DeltaNet, DeltaNet) on :meth:`GLAStateCache.static_copy` (the
  states are updated in place by the decode kernels, the short convs' inputs by the convs, and the store
  count lives on the device; fla's softmax ``attn`` layers write their keys and values into buffers of
  prompt + steps positions at a device-side position);
* transformers' hybrids with laquant's mixers (every family; minimax's a subclass that is also its
  ``MiniMaxCache``) on :class:`~laquant.models.static_hybrid.StaticHybridCache`: the same for the
  linear layers' states and short-conv inputs, plus the softmax layers' keys and values in buffers of
  prompt + steps positions written at a device-side position, with the attention mask and the
  positions following it.

The model's forward, the token choice (argmax or sampling) and the write of the chosen token into
the graph's input buffer and its token history are all captured, so a step is one ``graph.replay()``.
A graph is captured once per (model, batch size, sampling settings, state and KV layout) and reused
by later calls (:func:`release_graphs` frees them). EOS is checked on the host every
``eos_check_every`` steps only (a check is a device sync); sequences that finished earlier get
``eos_token_id`` after their EOS, and the output stops at the step at which all had finished.

The eager loop (``graphed=False``; always on the CPU, and where the decode step does not update its
states in place) is the reference: greedy output of the graphed loop equals it.

Sampling is Gumbel-max (``argmax(softmax(logits / T) / Exp(1))``: a draw from the softmax), with
``top_k`` keeping the k largest logits; the same function runs inside the graph and eagerly.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from laquant.adapters import cache_kwargs, returned_cache
from laquant.errors import LaquantError
from laquant.moe_experts import decode_experts_implementation, experts_implementation

EOS_CHECK_EVERY = 16
# the longest prompt a graphed prefill captures (its bucket's activations live in the graphs' memory pool)
MAX_GRAPHED_PREFILL = 16384


def pick_tokens(logits: torch.Tensor, do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token per row of ``logits [B, V]``: argmax, or a sample of ``softmax(logits / T)``
    restricted to the ``top_k`` largest. Graph-capturable (no host sync)."""
    if not do_sample:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise).argmax(-1)


def _check_args(model, input_ids, max_new_tokens, do_sample, temperature, top_k) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise LaquantError("input_ids must be a LongTensor [batch, prompt length]")
    if input_ids.shape[1] == 0 or input_ids.shape[0] == 0:
        raise LaquantError("input_ids is empty: generate needs a prompt of at least one token per sequence")
    if max_new_tokens < 1:
        raise LaquantError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if do_sample and not temperature > 0:
        raise LaquantError(f"temperature must be > 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise LaquantError(f"top_k must be >= 1, got {top_k}")
    vocab = model.config.vocab_size
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise LaquantError(f"input_ids holds token ids outside the model's vocabulary [0, {vocab})")


def _left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The prompts' padding as a bool mask ``[B, T]`` (False at a padded token), or None where there is none. Prompts
    of several lengths are padded on the left: each row's padding before its tokens, its last token real."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise LaquantError(f"attention_mask must be [batch, prompt length] as input_ids {tuple(input_ids.shape)}")
    mask = attention_mask.to(input_ids.device) != 0
    if bool(mask.all()):
        return None
    if not bool(mask[:, -1].all()) or bool((mask[:, :-1] & ~mask[:, 1:]).any()):
        raise LaquantError("attention_mask must pad the prompts on the left (each row's padding before its tokens, "
                           "its last token real)")
    return mask


def _padding_kwargs(model, mask: torch.Tensor) -> dict:
    """A padded prompt's forward arguments: the mask, and for a transformers hybrid each sequence's positions (as
    transformers' generate counts them: from its first real token)."""
    if hasattr(model, "new_cache"):  # laquant's models: the padding runs as no token, positions are not read
        return {"attention_mask": mask.long()}
    positions = mask.long().cumsum(-1) - 1
    return {"attention_mask": mask.long(), "position_ids": positions.masked_fill(~mask, 1)}


def is_graphable(model) -> bool:
    """Whether ``model``'s decode step can run on a static cache as one CUDA graph: laquant's GLA and
    transformers' hybrids with laquant's mixers (:mod:`laquant.models.static_hybrid`), on CUDA."""
    from laquant.families import FAMILIES
    from laquant.models import GLAForCausalLM

    if not next(model.parameters()).is_cuda:
        return False
    if isinstance(model, GLAForCausalLM):
        return True
    family = FAMILIES.get(getattr(model.config, "model_type", None))
    return family is not None and not family.native and getattr(model, "_laquant_positions_hook", False)


def graphable_cache(cache) -> bool:
    """Whether a speculative round (a verify step of several tokens and the commits) may be captured on a static
    copy of a prefilled cache: a hybrid's, or laquant's without softmax ``attn`` layers, whose static copy's
    attention takes one token a step. One-token decode steps (:func:`generate`'s loop, a draft's proposals, the
    serving replay's greedy decode) are captured on either."""
    from laquant.models.cache import GLAStateCache

    return not isinstance(cache, GLAStateCache) or not cache.kv


def static_cache(prefill_cache, capacity: int, keys: torch.Tensor | None = None):
    """A static copy of a prefilled cache for a captured decode step, with room for ``capacity`` tokens
    in all (softmax layers keep that many keys: a hybrid's, or fla's attn layers in laquant's GLA). ``keys``: a
    left-padded batch's cached positions that each sequence attends to (bool ``[B, seen]``; a hybrid's cache only),
    for a static cache of positions one a sequence (:class:`~laquant.models.static_hybrid.StaticHybridCache`)."""
    from laquant.families import static_hybrid_class
    from laquant.models.cache import GLAStateCache

    if isinstance(prefill_cache, GLAStateCache):
        if keys is not None:
            raise ValueError("laquant's GLA has no static cache for a padded batch")
        return prefill_cache.static_copy(capacity)
    return static_hybrid_class(prefill_cache).from_cache(prefill_cache, capacity, padded=keys is not None, keys=keys)


def _cached_tokens(cache) -> int:
    from laquant.models.cache import state_store

    return state_store(cache).seen_tokens


def _state_tensors(cache) -> list:
    """The recurrent layers' states of ``cache`` (not the None of laquant's softmax attn layers)."""
    from laquant.models.cache import state_store

    states = state_store(cache).states
    return [s for s in (states.values() if isinstance(states, dict) else states) if s is not None]


def static_forward(model, ids, cache) -> torch.Tensor:
    """The logits ``[B, V]`` of one decode step on a static cache (what a captured step runs)."""
    from laquant.models.static_hybrid import StaticHybridCache, static_attention

    if isinstance(cache, StaticHybridCache):
        with static_attention(model):
            logits, _ = _forward(model, ids, cache, **cache.begin_step())
        cache.end_step()
        return logits
    logits = _forward(model, ids, cache)[0]
    if cache.kv_pos is not None:  # laquant's model with softmax attn layers: their next position
        cache.kv_pos += 1
    return logits


def _fresh_cache(model):
    """The cache a prefill starts from: laquant's (GLA, or a transformers hybrid with laquant's
    mixers) or, for any other model (a peer), None: the model makes its own."""
    from laquant.adapters import new_cache

    if hasattr(model, "new_cache") or getattr(model, "_laquant_positions_hook", False):
        return new_cache(model)
    return None


def _forward(model, ids, cache, **kwargs):
    out = model(input_ids=ids, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1, **kwargs)
    return out.logits[:, -1], returned_cache(out)


def prefill_graphs(model):
    """``model``'s captured fresh prefills, one graph per token-count bucket and batch size, made on first use
    (:class:`~laquant.serving.graphed_prefill.GraphedPrefill` for laquant's models,
    :class:`~laquant.serving.graphed_hybrid_prefill.HybridPrefillGraphs` for the transformers hybrids);
    :func:`release_graphs` frees them."""
    from laquant.serving.graphed_hybrid_prefill import HybridPrefillGraphs
    from laquant.serving.graphed_prefill import GraphedPrefill

    graphs = model.__dict__.get("_laquant_prefill_graphs")
    if graphs is None:
        kind = GraphedPrefill if hasattr(model, "new_cache") else HybridPrefillGraphs
        graphs = model.__dict__["_laquant_prefill_graphs"] = kind(model, MAX_GRAPHED_PREFILL)
    return graphs


def graphed_prefill_refusal(model, tokens: int) -> str | None:
    """Why a fresh prefill of ``tokens`` tokens of ``model`` cannot replay as a CUDA graph, or None. The model's modules
    are walked once, by its :func:`prefill_graphs` (this runs before every graphed prefill)."""
    if not next(model.parameters()).is_cuda:
        return "CUDA graphs need a CUDA device"
    if not prefill_graphs(model).model_graphable():
        return (f"a graphed prefill covers laquant's GLA, Gated DeltaNet and DeltaNet with recurrent layers only, no "
                f"state round trip inside the prefill and no per-tensor activation scales, and the transformers "
                f"hybrids laquant adapted (laquant.adapters.install) without per-tensor activation scales or forward "
                f"hooks; this is {type(model).__name__}"
                + (" with softmax attn layers, prefill_roundtrip or per-tensor activations"
                   if hasattr(model, "new_cache") else ""))
    if tokens > MAX_GRAPHED_PREFILL:
        return f"the prompt has {tokens} tokens, more than the {MAX_GRAPHED_PREFILL} a graphed prefill captures"
    return None


def prefill(model, input_ids: torch.Tensor, graphed: bool = False, padding: torch.Tensor | None = None):
    """``(logits [B, V] of the last position, cache)`` of ``input_ids [B, T]`` from a fresh cache; ``graphed``:
    replayed as a CUDA graph per token-count bucket and batch size, captured on first use: the prompt padded to the
    bucket, its padding masked out of the state (:mod:`laquant.serving.graphed_prefill`; a transformers hybrid's
    padded on the left and its padding's keys dropped from the cache, :mod:`laquant.serving.graphed_hybrid_prefill`);
    eagerly where that capture failed (warned once). ``padding``: prompts padded on the left (bool ``[B, T]``, False
    at the padding), prefilled eagerly (a transformers hybrid's may replay too). Raises where the model or prompt is
    not covered."""
    cache = _fresh_cache(model)
    with torch.no_grad():  # as the replay: with gradients on, the model would take its reference ops
        if graphed:
            if padding is not None and hasattr(model, "new_cache"):
                raise LaquantError("laquant's models take a graphed prefill of prompts of one length; prefill a padded "
                                   "batch eagerly")
            refusal = graphed_prefill_refusal(model, input_ids.shape[1])
            if refusal is not None:
                raise LaquantError(f"no graphed prefill: {refusal}; prefill eagerly (graphed_prefill=False)")
            graphs = prefill_graphs(model)
            if graphs.failure is None:  # else a capture failed before (warned then): eagerly
                replayed = graphs(cache, input_ids) if padding is None else graphs(cache, input_ids, padding)
                if replayed is not None:
                    logits, cache = replayed
                    return logits[:, -1], cache
        return _forward(model, input_ids, cache, **({} if padding is None else _padding_kwargs(model, padding)))


def warm_up_outside_capture(fn, runs: int = 2) -> None:
    """Run ``fn`` ``runs`` times on a side stream: Triton compiles and autotunes its kernels there,
    before a CUDA graph captures them (the captures of laquant.generate, laquant.eval.ppl and
    laquant.serving.graphed_prefill)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(runs):
            fn()
    torch.cuda.current_stream().wait_stream(stream)


def weights_key(model) -> tuple:
    """Where ``model``'s weights live, as a captured graph reads them: the first parameter's storage, device and
    dtype (a model moved or cast after a capture, ``model.to(...)`` or ``model.half()``, gives every parameter new
    storage, and a graph replayed on the old addresses would compute from freed memory). One parameter, not all:
    this runs at every call that looks a graph up, and walking a 1.37B model's parameters costs ~0.2-0.8 ms."""
    first = next(model.parameters())
    return first.data_ptr(), first.device, first.dtype


def capture_graph(fn, pool=None):
    """``fn`` captured as a CUDA graph: ``(graph, what fn returned)``; ``pool``: a memory pool shared with other
    captures (``torch.cuda.graph_pool_handle()``), for graphs that never run concurrently and whose outputs are read
    before another one replays (one may reuse another's memory). Where the capture
    fails, the default CUDA generator's state is put back before the error propagates: torch leaves it in
    capture mode after a failed capture, and every later random op on the device would then fail."""
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    saved = generator.clone_state()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
    except BaseException:
        generator.graphsafe_set_state(saved)
        raise
    return graph, out


def capture_failure(exc: BaseException) -> str:
    """What made a capture fail, in one line. An error inside ``torch.cuda.graph`` makes ending the capture
    fail too ("operation failed due to a previous error during capture"), and that error is the one
    raised: the first one is its ``__context__``, named here as the cause."""
    first = lambda e: f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"  # noqa: E731
    cause = exc.__context__ if exc.__context__ is not None and exc.__context__ is not exc else None
    return first(exc) if cause is None else f"{first(cause)}; then {first(exc)}"


def graph_history(steps: int) -> int:
    """The tokens a captured decode loop's history holds for ``steps`` new tokens: a power of two, at least 256."""
    return max(256, 1 << (steps - 1).bit_length())


def kv_room(cached_tokens: int, history: int) -> int:
    """A captured hybrid's static keys: room for the prompt and the history, rounded up to 1,024 for later prompts."""
    return -(-(cached_tokens + history) // 1024) * 1024


class _NotInPlace(LaquantError):
    """A decode step replaced its state tensors instead of updating them: no graph can replay it."""


class _CaptureRefused(_NotInPlace):
    """The GPU refused to capture the decode step (an op that syncs with or copies from the host, such
    as transformers' fp32 grouped-GEMM MoE)."""


class _DecodeGraph:
    """One captured decode step on a static cache: reads ``tok [B, 1]``, writes the chosen token
    back into it and into ``history[:, pos]``, advances ``pos`` and marks finished rows."""

    def __init__(self, model, prefill_cache, capacity: int, choose, eos: int | None, experts: dict | None,
                 keys: torch.Tensor | None = None):
        self.model = weakref.ref(model)  # the model holds its graphs: no reference cycle
        self.choose, self.eos = choose, eos
        self.experts = experts  # the MoE experts implementation of its steps (None: as the model is set)
        # keys: a hybrid's left-padded prompts (each sequence's attended positions; static_cache)
        self.cache = static_cache(prefill_cache, kv_room(_cached_tokens(prefill_cache), capacity), keys)
        states = _state_tensors(self.cache)
        batch, device = states[0].data.shape[0], states[0].data.device
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.history = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.capacity = capacity
        warm_up_outside_capture(self._step)
        if any(a is not b for a, b in zip(states, _state_tensors(self.cache))):
            raise _NotInPlace("this model's decode step does not update its states in place (a state format "
                               "without a decode kernel, or LAQUANT_KERNELS=reference): decode with graphed=False")
        try:
            self.graph, _ = capture_graph(self._step)
        except RuntimeError as exc:
            raise _CaptureRefused(f"the GPU refused to capture this model's decode step ({capture_failure(exc)}): "
                                  "decode with graphed=False") from exc

    def _step(self) -> None:
        model = self.model()
        with experts_implementation(model, self.experts):
            logits = static_forward(model, self.tok, self.cache)
        nxt = self.choose(logits)
        if self.eos is not None:
            nxt = torch.where(self.done, torch.full_like(nxt, self.eos), nxt)
            self.done |= nxt == self.eos
        self.tok.copy_(nxt[:, None])
        self.history.index_copy_(1, self.pos, nxt[:, None])
        self.pos += 1

    def load(self, prefill_cache, first: torch.Tensor, keys: torch.Tensor | None = None) -> None:
        if keys is None:
            self.cache.load_from(prefill_cache)
        else:
            self.cache.load_from(prefill_cache, keys)
        self.tok.copy_(first[:, None])
        self.history[:, 0] = first
        self.pos.fill_(1)
        if self.eos is not None:
            torch.eq(first, self.eos, out=self.done)


def _graph_for(model, prefill_cache, batch, steps, key, choose, eos, keys=None) -> _DecodeGraph:
    """The model's captured step for ``key``, capturing it on first use (or when ``steps`` exceed
    the captured token history); ``keys``: a hybrid's left-padded prompts (its own graph, see :func:`static_cache`)."""
    from laquant.models.cache import state_layout, state_store
    from laquant.models.static_hybrid import kv_layers

    graphs = model.__dict__.setdefault("_laquant_decode_graphs", {})
    layout = state_layout(_state_tensors(prefill_cache))
    kv = tuple((i, tuple(k.shape[:-2]), k.shape[-1], v.shape[-1], k.dtype)
               for i, (k, v) in kv_layers(prefill_cache).items())
    seed = state_store(prefill_cache).seed
    setting = model.get_experts_implementation() if hasattr(model, "get_experts_implementation") else {}
    experts = decode_experts_implementation(model, batch)
    runs = tuple(sorted({**setting, **(experts or {})}.items()))  # the implementation the steps run
    # the seed is a launch argument baked into the graph, and so are the weights' addresses
    full_key = (batch, layout, kv, seed, runs, weights_key(model), keys is not None, *key)
    g = graphs.get(full_key)
    if isinstance(g, _NotInPlace):  # refused before: not captured again
        raise g
    room = getattr(g.cache, "capacity", None) if g is not None else None  # a hybrid's keys: prompt + steps
    if g is None or g.capacity < steps or (room is not None and room < _cached_tokens(prefill_cache) + steps):
        graphs.pop(full_key, None)
        try:
            # normal tensors even under torch.inference_mode: a later call without it loads into them in place
            with torch.inference_mode(False), torch.no_grad():
                g = _DecodeGraph(model, prefill_cache, graph_history(steps), choose, eos, experts, keys)
        except _NotInPlace as exc:
            graphs[full_key] = exc
            raise
        graphs[full_key] = g
    return g


def release_graphs(model) -> None:
    """Free the decode, prefill and forward graphs (and their static tensors) captured for ``model``."""
    from laquant.serving.graphed_forward import release_forward_graphs

    model.__dict__.pop("_laquant_decode_graphs", None)
    model.__dict__.pop("_laquant_prefill_graphs", None)
    release_forward_graphs(model)


def release_all_graphs(model) -> None:
    """:func:`release_graphs` and the decode-step graphs of transformers' ``generate``
    (:func:`laquant.models.graphed_step.release_step_graphs`): for a model whose modules or weights are replaced
    (quantized in place, moved, cast), which a captured graph would otherwise read at their old addresses."""
    from laquant.models.graphed_step import release_step_graphs

    release_graphs(model)
    release_step_graphs(model)


class DecodeSession:
    """A prompt prefilled and ready to decode: :meth:`step` makes one token per sequence (one
    ``graph.replay()`` when graphed), :meth:`tokens` returns what was generated. :func:`generate`
    and ``laquant eval speed`` both decode through it. ``graphed_prefill``: the prompt's prefill replayed as a CUDA
    graph (:func:`prefill`). ``attention_mask``: prompts of several lengths padded on the left (0 at the padding)."""

    def __init__(self, model, input_ids: torch.Tensor, max_new_tokens: int, *, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, eos_token_id: int | None = None,
                 graphed: bool | None = None, generator: torch.Generator | None = None,
                 graphed_prefill: bool = False, attention_mask: torch.Tensor | None = None):
        _check_args(model, input_ids, max_new_tokens, do_sample, temperature, top_k)
        device = next(model.parameters()).device
        if input_ids.device != device:
            input_ids = input_ids.to(device)
        padding = _left_padding(input_ids, attention_mask)
        auto = graphed is None
        if auto:
            graphed = is_graphable(model)
        elif graphed and not is_graphable(model):
            where = "CUDA" if device.type == "cuda" else f"{device.type} (CUDA graphs need a CUDA device)"
            raise LaquantError(f"a graphed decode loop needs laquant's GLAForCausalLM or a transformers hybrid with "
                               f"laquant's mixers, on CUDA; this is {type(model).__name__} on {where}: "
                               "decode eagerly (graphed=False)")
        if graphed and generator is not None and auto:
            graphed = False  # a generator drives the eager loop's sampling
        if graphed and generator is not None:
            raise LaquantError("a generator cannot drive the graphed loop's sampling (it draws from the default "
                               "CUDA generator: seed it with torch.manual_seed); pass graphed=False to use one")
        self.model, self.graphed, self.eos = model, graphed, eos_token_id
        self.max_new_tokens = max_new_tokens
        self.input_ids = input_ids
        self._choose = lambda logits: pick_tokens(logits, do_sample, temperature, top_k, generator)  # noqa: E731
        # the eager decode steps run the MoE experts as the graphed ones (the prefill as the model is set)
        self._experts = decode_experts_implementation(model, input_ids.shape[0]) if device.type == "cuda" else None
        with torch.no_grad():
            logits, cache = prefill(model, input_ids, graphed_prefill, padding)
            first = self._choose(logits)
            self.cache = cache
            self.made = 1
            # a hybrid's padded prompts: its softmax layers mask each sequence's padding and take its positions at
            # every step (laquant's models need neither once the prefill took the padding as no token)
            self._padding = padding if padding is not None and not hasattr(model, "new_cache") else None
            if graphed:
                key = (do_sample, float(temperature), top_k, eos_token_id)
                try:
                    self.graph = _graph_for(model, cache, input_ids.shape[0], max_new_tokens, key, self._choose,
                                            eos_token_id, self._padding)
                    self.graph.load(cache, first, self._padding)
                except (_NotInPlace, ValueError) as exc:  # in-place steps, or a cache a static one cannot hold
                    if not auto:
                        raise exc if isinstance(exc, LaquantError) else LaquantError(
                            f"this model's cache cannot be decoded on a static cache ({exc}): use graphed=False"
                        ) from exc
                    if not isinstance(exc, _NotInPlace) or isinstance(exc, _CaptureRefused):
                        warnings.warn(f"laquant.generate decodes eagerly: {exc}", stacklevel=3)
                    self.graphed = graphed = False  # graphed=None: the eager loop, on the untouched prefill cache
            if not graphed:
                self.tok = first
                self.generated = [first]
                self.done = first == eos_token_id if eos_token_id is not None else None

    def step(self) -> None:
        """One more token per sequence."""
        if self.made >= self.max_new_tokens:
            raise LaquantError(f"already made max_new_tokens = {self.max_new_tokens} tokens")
        if self.graphed:
            self.graph.graph.replay()
        else:
            with torch.no_grad(), experts_implementation(self.model, self._experts):
                logits, self.cache = _forward(self.model, self.tok[:, None], self.cache, **self._step_padding())
                nxt = self._choose(logits)
                if self.done is not None:
                    nxt = torch.where(self.done, torch.full_like(nxt, self.eos), nxt)
                    self.done |= nxt == self.eos
                self.tok = nxt
                self.generated.append(nxt)
        self.made += 1

    def _step_padding(self) -> dict:
        """An eager step's mask and positions for a hybrid's padded prompts (none otherwise): the padding, then every
        token since; each sequence's position counts its own tokens."""
        if self._padding is None:
            return {}
        B, T = self._padding.shape
        new = torch.ones(B, self.made, dtype=torch.bool, device=self._padding.device)
        mask = torch.cat([self._padding, new], 1)
        return {"attention_mask": mask.long(), "position_ids": mask.sum(-1, keepdim=True) - 1}

    def finished(self) -> bool:
        """Every sequence has produced EOS (a host sync; False without an eos_token_id)."""
        if self.eos is None:
            return False
        done = self.graph.done if self.graphed else self.done
        return bool(done.all())

    def tokens(self) -> torch.Tensor:
        """The generated tokens ``[B, n]``, cut after the step at which every sequence had finished."""
        if self.graphed:
            new = self.graph.history[:, :self.made].clone()
            self.graph.cache.sync_counters()
        else:
            new = torch.stack(self.generated, 1)
        return trim_after_eos(new, self.eos)

    def run(self, eos_check_every: int = EOS_CHECK_EVERY) -> torch.Tensor:
        """Decode up to ``max_new_tokens``, checking for EOS every ``eos_check_every`` steps; returns
        the prompt and the new tokens ``[B, T + n]``."""
        while self.made < self.max_new_tokens:
            if self.eos is not None and self.made % eos_check_every == 0 and self.finished():
                break
            self.step()
        return torch.cat([self.input_ids, self.tokens()], 1)


def trim_after_eos(new: torch.Tensor, eos: int | None) -> torch.Tensor:
    """``new [B, n]`` up to and including the first step at which every row has produced ``eos``."""
    if eos is None or new.shape[1] == 0:
        return new
    all_done = (new == eos).int().cummax(1).values.all(0)
    if not bool(all_done.any()):
        return new
    return new[:, : int(all_done.int().argmax()) + 1]


def generate(model, input_ids: torch.Tensor, max_new_tokens: int, *, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, eos_token_id: int | None = None,
             graphed: bool | None = None, generator: torch.Generator | None = None, draft_model=None,
             num_draft_tokens: int = 4, verify_numerics: str = "decode", graphed_prefill: bool = False,
             attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids [B, T]``; returns ``[B, T + n]``. Prompts of
    several lengths come padded on the left with their ``attention_mask`` (0 at the padding; each sequence decodes
    as it would alone; not with a ``draft_model``, nor with ``graphed_prefill`` on laquant's own models).
    ``graphed``: None graphs on CUDA
    (laquant's GLA, the hybrids) and decodes eagerly elsewhere (and where the model's decode step cannot be
    captured, or a ``generator`` is given); True insists on the graph; False is the eager reference loop.
    ``generator`` drives sampling in the eager loop only (the graph draws from the default CUDA generator).
    ``draft_model``: greedy speculative decoding, ``num_draft_tokens`` proposed a round by this model,
    or by prompt lookup with ``"ngram"`` (:mod:`laquant.serving.speculative`: each round one CUDA graph
    where the caches allow it, unless ``graphed=False``; the same tokens as without it; ``verify_numerics="prefill"``:
    faster verify steps with 8-bit states, the tokens up to near-ties, see
    :func:`~laquant.serving.speculative.speculative_generate`). ``graphed_prefill``: the prompt's prefill replays a
    CUDA graph captured per token-count bucket and batch size (:func:`prefill`; laquant's GLA, Gated DeltaNet and
    DeltaNet without softmax layers, and the transformers hybrids, on CUDA): a capture costs about three eager
    prefills (a hybrid's four: its check), a replay its GPU time alone, so it pays for prompts of one bucket served
    repeatedly (its first call is slower)."""
    if draft_model is not None:
        if _left_padding(input_ids, attention_mask) is not None:
            raise LaquantError("speculative decoding (draft_model) takes prompts of one length: drop the padding")
        if graphed_prefill:
            raise LaquantError("graphed_prefill is not taken with a draft_model (its prefill runs eagerly)")
        if do_sample:
            raise LaquantError("speculative decoding (draft_model) is greedy only: drop do_sample / temperature")
        from laquant.serving.speculative import speculative_generate

        return speculative_generate(model, draft_model, input_ids, max_new_tokens, num_draft_tokens, eos_token_id,
                                    graphed=graphed, verify_numerics=verify_numerics)
    return DecodeSession(model, input_ids, max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                         eos_token_id=eos_token_id, graphed=graphed, generator=generator,
                         graphed_prefill=graphed_prefill, attention_mask=attention_mask).run()


__all__ = ["DecodeSession", "capture_graph", "generate", "graphable_cache", "is_graphable", "pick_tokens", "prefill",
           "release_all_graphs", "release_graphs", "static_cache", "static_forward", "trim_after_eos"]
