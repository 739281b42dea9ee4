"""How much resuming from a snapshot changes the model: next-token loss on real text after a
``prefix``-token prefix, resumed from that prefix's snapshot (in a state format) against the
uninterrupted prefill (the prefix recomputed)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from laquant.adapters import cache_kwargs, new_cache
from laquant.serving.prefix_cache import PrefixStateCache


def text_windows(tokens: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """``n`` consecutive windows of ``length`` tokens from the start of ``tokens`` (1-D): ``[n, length]``."""
    from laquant.errors import LaquantError

    if tokens.numel() < n * length:
        raise LaquantError(f"the text has {tokens.numel()} tokens; {n} windows of {length} need {n * length}")
    return tokens[: n * length].view(n, length)


def resume_loss(model, windows: torch.Tensor, prefix: int, state_format: str | None, rounding: str | None = None,
                seed: int = 0, progress: bool = False) -> dict:
    """Mean next-token loss over tokens ``prefix + 1 ..`` of each window: recomputed (the whole window
    in one prefill) and resumed from the snapshot after ``prefix`` tokens (``state_format``, None: the
    model's own). Also the mean per-token ``|loss change|`` (relative to the loss: changes of opposite
    sign do not cancel there) and the largest logit difference seen."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    keep = windows.shape[1] - prefix
    pool = PrefixStateCache(model, prefix, budget_bytes=1 << 40, state_format=state_format, rounding=rounding,
                            seed=seed)
    full_nll = resumed_nll = abs_diff = 0.0
    count, max_diff = 0, 0.0
    for w in tqdm(windows, desc=f"resume {state_format or 'model'}", unit="win", disable=not progress, leave=False):
        labels = w[prefix + 1:].to(device)
        with torch.no_grad():
            full = model(input_ids=w.to(device)[None], **cache_kwargs(model, new_cache(model, seed)),
                         use_cache=True).logits
        full = full[0, prefix:-1].float()
        pool.clear()
        pool.prefill(w[:prefix + 1])  # caches the snapshot after ``prefix`` tokens
        logits, _, cached = pool.prefill(w, logits_to_keep=keep)
        if cached != prefix:
            raise RuntimeError(f"the snapshot after {prefix} tokens was not found (restored {cached})")
        resumed = logits[0, :-1].float()
        nll_full = F.cross_entropy(full, labels, reduction="none")
        nll_resumed = F.cross_entropy(resumed, labels, reduction="none")
        full_nll += nll_full.sum().item()
        resumed_nll += nll_resumed.sum().item()
        abs_diff += (nll_resumed - nll_full).abs().sum().item()
        count += labels.numel()
        max_diff = max(max_diff, (resumed - full).abs().max().item())
    loss_full, loss_resumed = full_nll / count, resumed_nll / count
    return dict(state_format=state_format or "model", prefix=prefix, tokens=count, windows=len(windows),
                loss_recomputed=loss_full, loss_resumed=loss_resumed,
                rel_loss_change=(loss_resumed - loss_full) / loss_full,
                rel_token_loss_abs_change=abs_diff / count / loss_full, max_logit_diff=max_diff)
