"""Perplexity with strided windows, in prefill mode (chunked path) and decode mode (recurrent path).

Windows follow the standard Hugging Face recipe: the tokens are scored in blocks of ``stride``;
each block is scored by a window of ``context`` tokens that ends with it, so every token after the
first is predicted exactly once, with at least ``context - stride`` tokens of left context (all
windows have the full length). Both modes see the same windows and the same targets: in exact
arithmetic they compute the same number.

* prefill: the whole window in one forward pass (chunked linear attention);
* decode: the window token by token, the recurrent state carried in a cache between steps. This
  is how a served model runs, and where a quantized state's error accumulates. laquant's GLA on
  CUDA replays one captured step per token (:class:`_GraphedScorer`: the decode kernels update the
  states in place, the step reads its token and scores the next one on the device), so a 64K-token
  window decodes in minutes; other models step eagerly.

Besides the loss of the scored tokens (``loss_by_position``: each window offset averaged over the
tokens scored there), a result keeps ``loss_by_position_all``: every window's loss at every offset,
scored or not, the curve to read the drift of a quantized state against its baseline from.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from laquant.adapters import cache_kwargs, new_cache
from laquant.errors import LaquantError
from laquant.eval.saturation import SaturationCounter
from laquant.generate import _state_tensors, capture_graph, static_cache, static_forward, warm_up_outside_capture
from laquant.serving.graphed_forward import HOST_BOUND_TOKENS, graphed_logits

MODES = ("prefill", "decode")
DEFAULT_BATCH = {"prefill": 4, "decode": 64}


@dataclass(frozen=True)
class Window:
    begin: int
    end: int
    first_target: int  # first position in [begin, end) whose token is scored


def default_stride(context: int) -> int:
    return max(1, context // 2)


def strided_windows(n_tokens: int, context: int, stride: int) -> list[Window]:
    if context < 2:
        raise LaquantError(f"--context must be at least 2 tokens, got {context}")
    if not 0 < stride < context:
        raise LaquantError(f"--stride must be in 1..{context - 1} (less than the context), got {stride}")
    if n_tokens < context:
        raise LaquantError(
            f"context {context} is longer than the data ({n_tokens} tokens); use a shorter --context or more data"
        )
    windows = [Window(0, context, 1)]
    while windows[-1].end < n_tokens:
        end = min(windows[-1].end + stride, n_tokens)
        windows.append(Window(end - context, end, windows[-1].end))
    return windows


@dataclass
class PerplexityResult:
    mode: str
    context: int
    stride: int
    tokens_scored: int
    nll: float  # mean negative log-likelihood, nats/token
    ppl: float
    seconds: float
    loss_by_position: list[float] = field(default_factory=list)  # mean NLL at each window offset
    loss_by_position_all: list[float] = field(default_factory=list)  # the same over every window's every token
    graphed: bool = False  # decode mode: one CUDA-graph replay per token; prefill: batches replayed as graphs
    # decode mode: the state and gate saturation counts by window offset (laquant.eval.saturation),
    # counted on the device inside the graphed step too
    saturation: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# A decode step of a small model on the CPU is a few hundred tiny ops; below this many elements
# per step (batch x hidden) an op's intra-op thread handoff costs more than its work, and on a
# shared machine a descheduled helper thread stalls every op (gla-small, B = 31: 0.2 s per step
# on 2 threads under load vs 0.02 s on one)
SMALL_DECODE_ELEMENTS = 1 << 16
# prefill mode replays its batches as CUDA graphs from this many batches of one shape (a capture costs ~3 forwards)
MIN_GRAPHED_BATCHES = 4


@contextlib.contextmanager
def decode_threads(model, batch: int):
    """One intra-op thread for the decode steps of a small model on the CPU (see above)."""
    device = next(model.parameters()).device
    hidden = getattr(model.config, "hidden_size", None) or 0
    before = torch.get_num_threads()
    if device.type != "cpu" or batch * hidden >= SMALL_DECODE_ELEMENTS or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _nll_rows(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token NLL in float32, ``logits [..., V]``, ``targets [...]``."""
    return torch.nn.functional.cross_entropy(
        logits.float().flatten(0, -2), targets.flatten(), reduction="none"
    ).view(targets.shape)


@torch.no_grad()
def perplexity(
    model,
    ids: torch.Tensor,
    context: int,
    stride: int | None = None,
    mode: str = "prefill",
    batch_size: int | None = None,
    progress: bool = True,
    on_units=None,
    graphed: bool = True,
) -> PerplexityResult:
    """Perplexity of ``model`` on the 1-D token tensor ``ids``.

    ``model(input_ids, cache=cache, use_cache=True)`` (``past_key_values=`` before transformers 5.24)
    must return ``.logits``, and
    ``laquant.adapters.new_cache(model)`` a fresh cache (decode mode). ``batch_size`` windows run
    together; by default 4 in prefill (activations grow with the window) and 64 in decode (one
    token per step: per-step overhead dominates, and a recurrent state is small). ``on_units(n)``:
    called as work is done, with tokens (prefill) or decode steps (decode), for the job's progress
    (:mod:`laquant.progress`; :func:`work_units` counts them ahead). ``graphed`` (on CUDA, for the models
    that allow it): decode mode replays one CUDA graph per token (:class:`_GraphedScorer`); prefill mode replays
    each batch's forward as a graph of the windows' exact length (:mod:`laquant.serving.graphed_forward`: the eager
    forward's numerics) where at least :data:`MIN_GRAPHED_BATCHES` batches share that shape (a capture costs about
    three forwards) of at most :data:`~laquant.serving.graphed_forward.HOST_BOUND_TOKENS` tokens (larger ones are
    bound by the GPU). False: eagerly.
    """
    tick = on_units or (lambda n: None)
    batch_size = batch_size or DEFAULT_BATCH[mode]
    if mode not in MODES:
        raise LaquantError(f"unknown --mode {mode!r}; choose from {', '.join(MODES)}")
    stride = stride or default_stride(context)
    windows = strided_windows(len(ids), context, stride)
    device = next(model.parameters()).device
    batches = [windows[i:i + batch_size] for i in range(0, len(windows), batch_size)]

    nll_sum = torch.zeros(context, dtype=torch.float64)
    count = torch.zeros(context, dtype=torch.float64)
    all_sum = torch.zeros(context, dtype=torch.float64)
    scorer = (_GraphedScorer.make(model, min(batch_size, len(windows)), context) if mode == "decode" and graphed
              else None)
    graph_prefill = (graphed and sum(len(b) == len(batches[0]) for b in batches) >= MIN_GRAPHED_BATCHES
                     and len(batches[0]) * context <= HOST_BOUND_TOKENS)
    replays = 0
    steps = len(batches) * context if mode == "decode" else len(windows)
    bar = tqdm(total=steps, desc=f"ppl {mode} ctx={context}", unit="tok" if mode == "decode" else "win",
               disable=not progress, leave=False)
    start = time.perf_counter()
    counter = SaturationCounter(model, context) if mode == "decode" else None
    offsets = torch.arange(1, context)  # every window is `context` tokens long
    try:
        for batch in batches:
            inputs = torch.stack([ids[w.begin:w.end] for w in batch]).to(device)
            # mask[b, p] is True where the token at offset p + 1 is scored (predicted from offset p)
            mask = torch.stack([offsets >= (w.first_target - w.begin) for w in batch])
            if mode == "prefill":
                full = graph_prefill and len(batch) == len(batches[0])  # a last, smaller batch: not worth a capture
                logits = graphed_logits(model, inputs, pad=False, enabled=True) if full else None
                replays += logits is not None
                if logits is None:
                    logits = model(input_ids=inputs).logits
                # row by row: one window's log-softmax at a time, not a copy of the whole batch's logits
                nll = torch.stack([_nll_rows(logits[i, :-1], inputs[i, 1:]) for i in range(len(batch))]).cpu()
                del logits
                bar.update(len(batch))
                tick(len(batch) * context)
            elif scorer is not None and (nll := scorer.score(inputs, bar, counter)) is not None:
                tick(context - 1)
            else:
                cache = new_cache(model)
                cols = []
                counter.start_sequence()
                with decode_threads(model, len(batch)):
                    for t in range(context - 1):
                        step_logits = model(input_ids=inputs[:, t:t + 1], **cache_kwargs(model, cache),
                                            use_cache=True).logits[:, 0]
                        counter.after_step(cache)
                        cols.append(_nll_rows(step_logits, inputs[:, t + 1]).cpu())
                        bar.update(1)
                        tick(1)
                bar.update(1)
                nll = torch.stack(cols, dim=1)
            if not torch.isfinite(nll[mask]).all():
                raise LaquantError(f"non-finite loss in {mode} mode: the model produced NaN/Inf logits")
            all_sum[1:] += nll.double().sum(0)
            nll = nll.double() * mask
            nll_sum[1:] += nll.sum(0)
            count[1:] += mask.sum(0)
    finally:
        if counter is not None:
            counter.close()
    bar.close()
    saturation = None
    if counter is not None:
        saturation = counter.result()
    seconds = time.perf_counter() - start
    total = int(count.sum().item())
    mean_nll = float(nll_sum.sum().item() / total)
    by_position = (nll_sum / count.clamp_min(1)).tolist()
    by_position_all = [0.0] + (all_sum[1:] / len(windows)).tolist()
    return PerplexityResult(mode, context, stride, total, mean_nll, math.exp(mean_nll), seconds, by_position,
                            by_position_all, scorer is not None and scorer.failure is None
                            if mode == "decode" else replays > 0, saturation)


class _GraphedScorer:
    """Teacher-forced decode of a batch of windows with one CUDA-graph replay per token: the
    captured step reads token ``pos`` of the windows (a device tensor), runs the model on a static
    cache (the decode kernels update its states in place and count the stores on the device, so a
    stochastically rounded state draws fresh bits each step) and writes the loss of token
    ``pos + 1`` into a device buffer. A window is started by one eager step (the states' first
    store), then ``context - 2`` replays; the losses come back in one copy."""

    def __init__(self, model, batch: int, context: int, first_cache, counter=None):
        self.model, self.counter = model, counter
        device = next(model.parameters()).device
        self.inputs = torch.zeros(batch, context, dtype=torch.long, device=device)
        self.nll = torch.zeros(batch, context - 1, dtype=torch.float32, device=device)
        self.pos = torch.ones(1, dtype=torch.long, device=device)
        self.cache = static_cache(first_cache, context)
        states = _state_tensors(self.cache)
        if counter is not None:
            counter.active = False  # the warm-up step is not counted
        warm_up_outside_capture(self._step, runs=1)
        if counter is not None:
            counter.active = True
        if any(a is not b for a, b in zip(states, _state_tensors(self.cache))):
            raise LaquantError("this model's decode step does not update its states in place")
        self.graph, _ = capture_graph(self._step)

    @classmethod
    def make(cls, model, batch: int, context: int) -> _GraphedScorer | None:
        """A scorer for a model that laquant.generate graphs (laquant's GLA, transformers' hybrids; on
        CUDA) whose state formats have decode kernels; else None (the eager loop)."""
        from laquant.generate import is_graphable
        from laquant.kernels.common.formats import KERNEL_FORMATS

        if not is_graphable(model) or context < 3:
            return None
        formats = {m.state_quantizer.format.name for m in model.modules() if hasattr(m, "state_quantizer")}
        if not formats <= set(KERNEL_FORMATS):
            return None
        return _Lazy(cls, model, batch, context)

    def _step(self) -> None:
        tok = self.inputs.index_select(1, self.pos)
        logits = static_forward(self.model, tok, self.cache)
        target = self.inputs.index_select(1, self.pos + 1)[:, 0]
        self.nll.index_copy_(1, self.pos, _nll_rows(logits, target)[:, None])
        if self.counter is not None:
            self.counter.after_step(self.cache)
        self.pos += 1

    def run(self, inputs: torch.Tensor, first_cache, first_nll: torch.Tensor, bar) -> torch.Tensor:
        self.inputs[: len(inputs)].copy_(inputs)
        self.cache.load_from(first_cache)
        self.pos.fill_(1)
        self.nll[:, 0] = first_nll
        for _ in range(self.inputs.shape[1] - 2):
            self.graph.replay()
            bar.update(1)
        bar.update(2)
        return self.nll[: len(inputs)].cpu()


class _Lazy:
    """Captures the graph on the first batch (it needs a prefilled cache), pads smaller batches."""

    def __init__(self, cls, model, batch, context):
        self.cls, self.model, self.batch, self.context = cls, model, batch, context
        self.scorer = None
        self.failure: str | None = None

    def score(self, inputs: torch.Tensor, bar, counter=None) -> torch.Tensor | None:
        """The batch's losses, or None where the GPU refused the capture (the reason in
        :attr:`failure`, warned once; the counters as they were): the caller scores it eagerly."""
        if self.failure is not None:
            return None
        n = len(inputs)
        if n < self.batch:  # the last batch: padded with copies of its last window, dropped after
            inputs = torch.cat([inputs, inputs[-1:].expand(self.batch - n, -1)])
        cache = new_cache(self.model)
        saved = counter.save() if counter is not None and self.scorer is None else None
        if counter is not None:
            counter.start_sequence(rows=n)
        logits = self.model(input_ids=inputs[:, :1], **cache_kwargs(self.model, cache), use_cache=True).logits[:, 0]
        if counter is not None:
            counter.after_step(cache)
        first_nll = _nll_rows(logits, inputs[:, 1])
        if self.scorer is None:
            try:
                self.scorer = self.cls(self.model, self.batch, self.context, cache, counter)
            except (LaquantError, RuntimeError, ValueError) as exc:  # a capture refused, or a cache a static one
                # cannot hold (softmax attn layers' keys): slower, never wrong
                self.failure = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                warnings.warn(f"laquant eval ppl: the decode step could not be captured as a CUDA graph "
                              f"({self.failure}); it runs eagerly", stacklevel=2)
                if saved is not None:
                    counter.load(saved)
                return None
        return self.scorer.run(inputs, cache, first_nll, bar)[:n]


def work_units(n_tokens: int, context: int, mode: str, batch_size: int | None = None) -> int:
    """What :func:`perplexity` reports to ``on_units`` in all: tokens through the model (prefill) or
    decode steps, each one token for every window of a batch (decode)."""
    windows = len(strided_windows(n_tokens, context, default_stride(context)))
    if mode == "prefill":
        return windows * context
    return -(-windows // (batch_size or DEFAULT_BATCH[mode])) * (context - 1)


@torch.no_grad()
def probe(model, ids: torch.Tensor, context: int, mode: str, batch_size: int | None = None,
          steps: int = 3) -> tuple[float, int]:
    """``(seconds, units)`` of a little of :func:`perplexity`'s work, for a job's estimate before its
    evaluation runs: one window in prefill (``context`` tokens); in decode, ``steps`` eager steps of
    a full batch after one untimed step."""
    device = next(model.parameters()).device
    window = ids[:context].to(device)
    if mode == "prefill":
        t0 = time.perf_counter()
        model(input_ids=window[None])
        return time.perf_counter() - t0, len(window)
    batch = min(batch_size or DEFAULT_BATCH[mode], max(len(strided_windows(len(ids), context,
                                                                            default_stride(context))), 1))
    tokens = window[:steps + 1].expand(batch, -1)
    cache = new_cache(model)
    with decode_threads(model, batch):
        model(input_ids=tokens[:, :1], **cache_kwargs(model, cache), use_cache=True)
        t0 = time.perf_counter()
        for t in range(1, tokens.shape[1]):
            model(input_ids=tokens[:, t:t + 1], **cache_kwargs(model, cache), use_cache=True)
    return time.perf_counter() - t0, tokens.shape[1] - 1


def perplexity_by_mode(model, ids: torch.Tensor, context: int, modes, batch_size: int | None = None,
                       progress: bool = True) -> dict[str, PerplexityResult]:
    """:func:`perplexity` for each mode in ``modes``, on the same windows."""
    return {mode: perplexity(model, ids, context=context, mode=mode, batch_size=batch_size, progress=progress)
            for mode in modes}
