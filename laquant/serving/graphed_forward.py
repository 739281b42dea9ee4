"""A whole forward of laquant's models (and of the transformers hybrids it adapted) replayed as a CUDA graph: the
calls that score text.

lm-eval's ``HFLM`` (``laquant eval lm-eval``) and ``laquant eval ppl``'s prefill mode call ``model(input_ids)``
without a cache and read the logits of every position. Eagerly, that forward is bound by the host: up to ~2K
tokens, a forward of a 1.37B GLA takes 20-50 ms of Python and launches on the lent H200s' hosts for 2-12 ms of GPU
work, and the quantized model's wrappers cost the host more than bf16's (``eval/results/fast_launch_h200/``), so a
quantized model scored text no faster than the bf16 model it replaces.

``laquant eval ppl``'s prefill mode replays its batches at the windows' exact length (the eager numerics: the same
kernels on the same shapes). With ``model.laquant_graph_forward = True`` (or ``LAQUANT_GRAPH_FORWARD=1``; ``laquant
eval lm-eval --graphed``), a cacheless call replays a graph captured per batch size and token-count bucket
(:func:`~laquant.serving.graphed_prefill.bucket_for`: powers of two from 64 to 1,024, then multiples of 1,024), the
tokens padded at the end with token 0: the model is causal, so the padding cannot reach the real positions' logits
but through rounding, and those logits are copied out of the graph's memory.

What it covers: laquant's own models (GLA, Gated DeltaNet, DeltaNet, with fla's softmax ``attn`` layers too: no
cache is kept, so nothing grows) called without a cache and with ``use_cache`` off, and the transformers hybrids
laquant adapted (:mod:`laquant.adapters.hybrid`) called with token ids only (``use_cache`` unset or off: lm-eval's
call; no cache is returned), on CUDA, without gradients, a 2-D batch of at most :data:`HOST_BOUND_TOKENS` tokens in
all once padded (more are bound by the GPU, not the host), no quantized linear with per-tensor activation scales (one
scale over every token of the call, which the padding would move), no forward hooks (a replay runs no Python) but
those marked ``laquant_cacheless_noop``. Anything else runs eagerly, as does a call whose capture failed (warned once:
an out-of-memory capture refuses that batch size and bucket only, any other failure every later capture of the model).
A hybrid's new capture is checked once against its eager forward on the same tokens (bit for bit, or every later
forward of the model runs eagerly, warned): transformers' code runs inside.

transformers' mask builders take a stream capture for tracing (``is_tracing``): they then skip the checks that read
the device and build an explicit mask where the eager call lets SDPA run ``is_causal``: another attention kernel,
other roundings, which a random MoE router amplifies (a random qwen3_next's logits moved by up to 0.23-0.5 of the
largest on an H200, the eager forward given that mask moving as far, ``eval/results/hybrid_scoring_h200/``).
transformers 5.17 builds it in ``_ignore_causal_mask_sdpa``, 5.24 in its packed-sequence check. A capture runs with
both answered as the eager call answers them (:func:`_eager_masks`): its positions are ``arange``, one sequence a
row, and it has no padding mask.

Numerics: the eager forward's, bit for bit at a bucket's length (the same kernels on the same shapes; GPU-tested).
Padded, the real positions' logits differ by rounding: a longer M can take other GEMM tiles and prefill pieces, and
a random 24-layer model amplifies that (up to 0.055 of the largest logit for bf16, 0.29 for ``gla_int8_all`` at 1,000
tokens padded to 1,024 on an H200; on the trained gla-small up to 1.6% of it, the mean NLL 0.0008-0.016%,
``eval/results/hybrid_scoring_h200/``); so padding is opt-in. A capture costs about three eager forwards (two
warm-ups, then the capture), a hybrid's four (its check). At most :data:`MAX_CAPTURES` stay captured; the least
recently used is freed first. Each holds its batch's logits (``B x bucket x vocab``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections import OrderedDict

import torch

from laquant.serving.graphed_prefill import bucket_for, quantizer_key

# calls of more tokens (batch x bucket) run eagerly: they are bound by the GPU, not the host. On an H200 the 1.37B GLA's
# eager forward of 4 x 2,048 tokens took as long as its replay, of 1 x 2,048 or 8 x 512 1.4-3.3x longer
# (eval/results/graphed_forward_h200/); a larger model is bound by the GPU from fewer tokens
HOST_BOUND_TOKENS = 4096
MAX_CAPTURES = 8
_GRAPHS = "_laquant_forward_graphs"


def graph_forward_enabled(model) -> bool:
    """``model.laquant_graph_forward`` where set, else ``LAQUANT_GRAPH_FORWARD=1``."""
    flag = getattr(model, "laquant_graph_forward", None)
    return bool(flag) if flag is not None else os.environ.get("LAQUANT_GRAPH_FORWARD", "0") == "1"


def forward_graphable(model) -> bool:
    """Whether ``model``'s cacheless forward can replay padded: laquant's GLA (Gated DeltaNet, DeltaNet) or a
    transformers hybrid laquant adapted, no quantized linear with per-tensor activation scales, and no forward hooks
    (a replay runs no Python: calibration's observers would see nothing) but those that do nothing without a cache
    (``laquant_cacheless_noop``)."""
    return _Walk(model).graphable()


class _Walk:
    """What :func:`forward_graphable` and a capture's key read from ``model``'s modules, walked once (~1 ms for a
    24-layer model on a CPU: per call, that was a third of a short replay). A capture holds the modules it saw, so
    a model whose modules are replaced must release its graphs anyway (laquant's quantize and ``_apply`` do); the
    hooks, which come and go, are checked at every call."""

    def __init__(self, model):
        from laquant.adapters.hybrid import is_adapted_hybrid
        from laquant.models import GLAForCausalLM
        from laquant.quant.modules import QuantLinear

        self.modules = list(model.modules())
        self.checked = is_adapted_hybrid(model)  # transformers' code runs in its forward: see GraphedForward._faithful
        self.covered = (isinstance(model, GLAForCausalLM) or self.checked) and not any(
            isinstance(m, QuantLinear) and m.act_granularity == "per_tensor" for m in self.modules)
        self.quantizers = [q for m in self.modules if (q := getattr(m, "state_quantizer", None)) is not None]

    def graphable(self) -> bool:
        from torch.nn.modules import module as nn_module

        return (self.covered and not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks
                and not any(_live_hooks(m) for m in self.modules))

    def quantizers_key(self) -> tuple:
        """What a capture takes from the mixers' state quantizers (a prefill's state round trip)."""
        return tuple(map(quantizer_key, self.quantizers))


def _live_hooks(module) -> bool:
    return any(not getattr(hook, "laquant_cacheless_noop", False)
               for hooks in (module._forward_hooks, module._forward_pre_hooks) for hook in hooks.values())


def cacheless_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """The logits of ``model``'s forward of ``input_ids`` without a cache, as a capture records it."""
    from laquant.models import GLAForCausalLM

    if isinstance(model, GLAForCausalLM):
        return model.lm_head(model.model(input_ids, None))
    with _eager_masks():  # the class's forward, not laquant's wrapper (which would replay)
        return type(model).forward(model, input_ids=input_ids, use_cache=False).logits


@contextlib.contextmanager
def _eager_masks():
    """transformers' mask builders (``masking_utils``) inside as outside a capture, on a call with token ids only:
    their ``is_tracing`` (true while a stream captures) answered false, and the packing check, which outside a
    capture reads the device, answered "one sequence a row" (a capture's positions are ``arange``)."""
    from transformers import masking_utils

    saved = masking_utils.is_tracing, masking_utils.find_packed_sequence_indices
    masking_utils.is_tracing, masking_utils.find_packed_sequence_indices = _not_tracing, _one_sequence_a_row
    try:
        yield
    finally:
        masking_utils.is_tracing, masking_utils.find_packed_sequence_indices = saved


def _not_tracing(tensor=None):
    return False


def _one_sequence_a_row(position_ids):
    return None


def graphed_logits(model, input_ids, pad: bool = True, enabled: bool | None = None) -> torch.Tensor | None:
    """The logits ``[B, T, vocab]`` of ``model(input_ids)`` (no cache) as a replay, or None where this call runs
    eagerly (graphs off, not CUDA, gradients on, training, inside another capture, over :data:`HOST_BOUND_TOKENS` tokens
    in all, a model :func:`forward_graphable` does not cover, or a capture that failed). ``pad`` False captures
    ``input_ids``' exact length (a caller whose calls all have one length: no padding, the eager numerics).
    ``enabled``: whether graphs are on for this call (None: :func:`graph_forward_enabled`)."""
    enabled = graph_forward_enabled(model) if enabled is None else enabled
    if not (enabled and isinstance(input_ids, torch.Tensor) and _on_graph_device(input_ids)
            and input_ids.dim() == 2 and 0 < captured_tokens(input_ids, pad) <= HOST_BOUND_TOKENS
            and not model.training and not torch.is_grad_enabled() and not _capturing()):
        return None
    return forward_graphs(model)(input_ids, pad)


def captured_tokens(input_ids: torch.Tensor, pad: bool = True) -> int:
    """Tokens a replay of ``input_ids`` ``[B, T]`` runs: B times the bucket of T (``pad``) or T."""
    B, T = input_ids.shape
    return B * (bucket_for(T) if pad and T else T)


def _on_graph_device(t: torch.Tensor) -> bool:
    return t.is_cuda


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def forward_graphs(model) -> GraphedForward:
    """``model``'s captured forwards, made on first use; :func:`release_forward_graphs` frees them (so does
    :func:`laquant.generate.release_graphs`)."""
    graphs = model.__dict__.get(_GRAPHS)
    if graphs is None:
        graphs = model.__dict__[_GRAPHS] = GraphedForward(model, use_graph=next(model.parameters()).is_cuda)
    return graphs


def release_forward_graphs(model) -> None:
    model.__dict__.pop(_GRAPHS, None)


class _Capture:
    """One (batch, tokens) forward on static token ids; ``graph`` None re-runs it eagerly on the same tensors (the
    CPU tests' path: everything but the capture itself)."""

    def __init__(self, model, batch: int, tokens: int, use_graph: bool, pool=None):
        self._model = weakref.ref(model)  # the model holds its captures: no cycle
        self.ids = torch.zeros(batch, tokens, dtype=torch.long, device=next(model.parameters()).device)
        self.graph = self.logits = None
        if use_graph:
            from laquant.generate import capture_graph, warm_up_outside_capture

            warm_up_outside_capture(self._run)
            self.graph, self.logits = capture_graph(self._run, pool)

    @torch.no_grad()
    def _run(self) -> torch.Tensor:
        return cacheless_logits(self._model(), self.ids)

    def replay(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.run(input_ids)[:, :input_ids.shape[1]].clone()

    def run(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The logits of the whole static batch with ``input_ids`` in it (padded with token 0), in the graph's memory
        (valid until the next replay)."""
        T = input_ids.shape[1]
        self.ids[:, T:].zero_()
        self.ids[:, :T].copy_(input_ids)
        if self.graph is None:
            return self._run()
        self.graph.replay()
        return self.logits


class GraphedForward:
    """Cacheless forwards of ``model`` replayed per (batch, token count) key, captured on first use; ``use_graph``
    False re-runs them eagerly on the same static tensors (CPU, tests)."""

    def __init__(self, model, use_graph: bool = True, max_captures: int = MAX_CAPTURES):
        self._model, self.use_graph, self.max_captures = weakref.ref(model), use_graph, max_captures
        self.captures: OrderedDict = OrderedDict()  # least recently used first
        self.refused: dict = {}  # key -> why its capture failed (an out-of-memory error: that key only)
        self.failure: str | None = None  # a failure other than memory: every later forward runs eagerly
        self.pool = None  # the captures' shared memory pool: each replay's logits are copied out before the next
        self.walk: _Walk | None = None  # the model's modules, walked at the first call

    def __call__(self, input_ids: torch.Tensor, pad: bool = True) -> torch.Tensor | None:
        model = self._model()
        if model is None or self.failure is not None:
            return None
        self.walk = self.walk or _Walk(model)
        if not self.walk.graphable():
            return None
        from laquant.generate import weights_key

        tokens = bucket_for(input_ids.shape[1]) if pad else input_ids.shape[1]
        key = (input_ids.shape[0], tokens, self.walk.quantizers_key(), weights_key(model))
        if key in self.refused:
            return None
        capture = self.captures.get(key)
        if capture is None:
            capture = self._capture(model, key, input_ids.shape[0], tokens)
            if capture is None or (self.walk.checked and not self._faithful(model, key, capture, input_ids)):
                return None
        self.captures.move_to_end(key)
        return capture.replay(input_ids)

    def _faithful(self, model, key, capture: _Capture, input_ids: torch.Tensor) -> bool:
        """Whether a new capture of a transformers hybrid replays its eager forward bit for bit, on the first call's
        tokens padded as replayed. Its forward is transformers' code, which may decide at capture time what it decides
        per call eagerly (its masks did: :func:`_eager_masks`), and changes with transformers' versions; a capture that
        differs turns the model's graphs off, warned, rather than give other numbers. Out of memory for the check's
        eager forward beside the capture, that batch size and bucket run eagerly."""
        replayed = capture.run(input_ids)
        try:
            eager = cacheless_logits(model, capture.ids)
        except torch.OutOfMemoryError as exc:
            self.captures.pop(key, None)
            self._give_up(key, exc, "a forward's capture could not be checked")
            return False
        if torch.equal(replayed, eager):
            return True
        diff = (replayed.float() - eager.float()).abs().max().item()
        self.failure = (f"a replay differed from the eager forward by up to {diff:.3g} (largest |logit| "
                        f"{eager.float().abs().max().item():.3g})")
        self.captures.clear()
        warnings.warn(f"laquant: {type(model).__name__}'s forward does not replay as a CUDA graph ({self.failure}); "
                      "its forwards run eagerly", stacklevel=4)
        return False

    def _capture(self, model, key, batch: int, tokens: int) -> _Capture | None:
        while len(self.captures) >= self.max_captures:
            self.captures.popitem(last=False)
        if not self.captures:  # a pool dies with the last graph that used it (a failed capture's included):
            self.pool = None  # capturing into its handle again trips an assert in PyTorch's caching allocator
        if self.use_graph and self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            with torch.inference_mode(False):  # normal tensors: later replays copy into them in place
                capture = _Capture(model, batch, tokens, self.use_graph, self.pool)
        except RuntimeError as exc:  # slower, never wrong: eagerly
            self._give_up(key, exc, "a forward could not be captured as a CUDA graph")
            return None
        self.captures[key] = capture
        return capture

    def _give_up(self, key, exc: RuntimeError, what: str) -> None:
        from laquant.generate import capture_failure

        give_up(self, key, capture_failure(exc), isinstance(exc, torch.OutOfMemoryError), what, "forwards")


def give_up(graphs, key: tuple, why: str, out_of_memory: bool, what: str, calls: str) -> None:
    """Eagerly from now on, warned: after running out of memory, the ``calls`` of ``key``'s batch size and bucket
    (``key[:2]``; ``graphs.refused``), after any other failure every one of the model's (``graphs.failure``)."""
    if out_of_memory:
        graphs.refused[key] = why
        scope = f"{calls} of {key[0]} x {key[1]} tokens run eagerly"
    else:
        graphs.failure = why
        scope = f"its {calls} run eagerly"
    warnings.warn(f"laquant: {what} ({why}); {scope}", stacklevel=5)
