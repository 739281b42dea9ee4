"""Perplexity with strided windows, in prefill mode (chunked path) and decode mode (recurrent path).

Windows follow the standard Hugging Face recipe: the tokens are scored in blocks of ``stride``;
each block is scored by a window of ``context`` tokens that ends with it, so every token after the
first is predicted exactly once, with at least ``context - stride`` tokens of left context (all
windows have the full length). Both modes see the same windows and the same targets: in exact
arithmetic they compute the same number.

* prefill: the whole window in one forward pass (chunked linear attention);
* decode: the window token by token, the recurrent state carried in a cache between steps. This
  is how a served model runs, and where a quantized state's error accumulates.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from laquant.adapters import new_cache
from laquant.errors import LaquantError
from laquant.eval.saturation import SaturationCounter

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
    # decode mode: the state and gate saturation counts by window offset (laquant.eval.saturation)
    saturation: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# A decode step of a small model on the CPU is a few hundred tiny ops; below this many elements
# per step (batch x hidden) an op's intra-op thread handoff costs more than its work, and on a
# shared machine a descheduled helper thread stalls every op (gla-small, B = 31: 0.2 s per step
# on 2 threads under load vs 0.02 s on one)
SMALL_DECODE_ELEMENTS = 1 << 16


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
) -> PerplexityResult:
    """Perplexity of ``model`` on the 1-D token tensor ``ids``.

    ``model(input_ids, past_key_values=cache, use_cache=True)`` must return ``.logits``, and
    ``laquant.adapters.new_cache(model)`` a fresh cache (decode mode). ``batch_size`` windows run
    together; by default 4 in prefill (activations grow with the window) and 64 in decode (one
    token per step: per-step overhead dominates, and a recurrent state is small).
    """
    batch_size = batch_size or DEFAULT_BATCH[mode]
    if mode not in MODES:
        raise LaquantError(f"unknown --mode {mode!r}; choose from {', '.join(MODES)}")
    stride = stride or default_stride(context)
    windows = strided_windows(len(ids), context, stride)
    device = next(model.parameters()).device
    batches = [windows[i:i + batch_size] for i in range(0, len(windows), batch_size)]

    nll_sum = torch.zeros(context, dtype=torch.float64)
    count = torch.zeros(context, dtype=torch.float64)
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
                logits = model(input_ids=inputs).logits
                # row by row: one window's log-softmax at a time, not a copy of the whole batch's logits
                nll = torch.stack([_nll_rows(logits[i, :-1], inputs[i, 1:]) for i in range(len(batch))]).cpu()
                del logits
                bar.update(len(batch))
            else:
                cache = new_cache(model)
                cols = []
                counter.position = 0
                with decode_threads(model, len(batch)):
                    for t in range(context - 1):
                        step_logits = model(input_ids=inputs[:, t:t + 1], past_key_values=cache,
                                            use_cache=True).logits[:, 0]
                        counter.after_step(cache)
                        cols.append(_nll_rows(step_logits, inputs[:, t + 1]).cpu())
                        bar.update(1)
                bar.update(1)
                nll = torch.stack(cols, dim=1)
            if not torch.isfinite(nll[mask]).all():
                raise LaquantError(f"non-finite loss in {mode} mode: the model produced NaN/Inf logits")
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
    return PerplexityResult(mode, context, stride, total, mean_nll, math.exp(mean_nll), seconds, by_position,
                            saturation)


def perplexity_by_mode(model, ids: torch.Tensor, context: int, modes, batch_size: int | None = None,
                       progress: bool = True) -> dict[str, PerplexityResult]:
    """:func:`perplexity` for each mode in ``modes``, on the same windows."""
    return {mode: perplexity(model, ids, context=context, mode=mode, batch_size=batch_size, progress=progress)
            for mode in modes}
