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

import math
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from laquant.adapters import new_cache
from laquant.errors import LaquantError

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

    def to_dict(self) -> dict:
        return asdict(self)


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
    offsets = torch.arange(1, context)  # every window is `context` tokens long
    for batch in batches:
        inputs = torch.stack([ids[w.begin:w.end] for w in batch]).to(device)
        # mask[b, p] is True where the token at offset p + 1 is scored (predicted from offset p)
        mask = torch.stack([offsets >= (w.first_target - w.begin) for w in batch])
        if mode == "prefill":
            logits = model(input_ids=inputs).logits[:, :-1]
            nll = _nll_rows(logits, inputs[:, 1:]).cpu()
            bar.update(len(batch))
        else:
            cache = new_cache(model)
            cols = []
            for t in range(context - 1):
                step_logits = model(input_ids=inputs[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, 0]
                cols.append(_nll_rows(step_logits, inputs[:, t + 1]).cpu())
                bar.update(1)
            bar.update(1)
            nll = torch.stack(cols, dim=1)
        if not torch.isfinite(nll[mask]).all():
            raise LaquantError(f"non-finite loss in {mode} mode: the model produced NaN/Inf logits")
        nll = nll.double() * mask
        nll_sum[1:] += nll.sum(0)
        count[1:] += mask.sum(0)
    bar.close()
    seconds = time.perf_counter() - start
    total = int(count.sum().item())
    mean_nll = float(nll_sum.sum().item() / total)
    by_position = (nll_sum / count.clamp_min(1)).tolist()
    return PerplexityResult(mode, context, stride, total, mean_nll, math.exp(mean_nll), seconds, by_position)


def perplexity_by_mode(model, ids: torch.Tensor, context: int, modes, batch_size: int | None = None,
                       progress: bool = True) -> dict[str, PerplexityResult]:
    """:func:`perplexity` for each mode in ``modes``, on the same windows."""
    return {mode: perplexity(model, ids, context=context, mode=mode, batch_size=batch_size, progress=progress)
            for mode in modes}
