"""The prompt lookup's rule in PyTorch (any device; the spec of :mod:`.lookup`'s kernel)."""

from __future__ import annotations

import torch


def ngram_lookup_reference(context: torch.Tensor, length: torch.Tensor, k: int, max_ngram: int = 3,
                           min_ngram: int = 1) -> torch.Tensor:
    """``k`` proposed tokens ``[B, k]`` for each row of ``context [B, L]``, whose first ``length`` tokens
    (a device scalar, the same for every row) are the sequence so far.

    For the largest ``n`` in ``max_ngram .. min_ngram`` whose last ``n`` tokens occur earlier (a start
    ``s <= length - n - 1``, so at least one token follows it), the latest such ``s`` is taken and the
    tokens after it are proposed: ``context[s + n + (j mod P)]`` for ``j < k``, ``P = length - n - s``.
    Past the known tokens the match's period ``P`` continues the sequence (a loop of ``P`` tokens goes
    on looping). A row without a match proposes its last token ``k`` times (token 0 while ``length`` is
    0: a captured round's warm-up runs on an empty context). No host sync: capturable in a CUDA graph
    (~35 small kernels on the GPU, where :func:`.lookup.ngram_lookup_triton` is one)."""
    B, L = context.shape
    device = context.device
    length = length.reshape(())
    # every n at once: m[e], for how many tokens (up to max_ngram) the tokens ending at position e equal the
    # sequence's last ones, compared from the right (before the context's start, -1 pads, which no token equals)
    padded = torch.cat([context.new_full((B, max_ngram - 1), -1), context], 1)
    tail = padded.index_select(1, (length - 1 + torch.arange(max_ngram, device=device)).clamp(0, L + max_ngram - 2))
    same = padded.unfold(1, max_ngram, 1) == tail[:, None, :]  # [B, L, max_ngram]
    m = same.flip(-1).int().cumprod(-1).sum(-1)
    ends = torch.arange(L, device=device)
    # the longest match, then the latest, among those with a token after them (an end e <= length - 2)
    key = torch.where((m >= min_ngram) & (ends <= length - 2), m * L + ends, -1).amax(1)
    end = key % L
    period = (length - 1 - end).clamp(min=1)
    src = end[:, None] + 1 + torch.arange(k, device=device) % period[:, None]
    src = torch.where((key >= 0)[:, None], src, (length - 1).clamp(0, L - 1))
    return context.gather(1, src)
