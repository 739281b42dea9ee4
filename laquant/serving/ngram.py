"""Prompt lookup: draft tokens found in the sequence itself, for speculative decoding without a draft model.

transformers calls it prompt lookup decoding (``prompt_lookup_num_tokens``), vLLM the ``ngram`` method. The
last ``n`` tokens of the sequence (prompt and tokens made so far) are looked up earlier in it; the tokens
that followed that earlier occurrence are proposed. Proposing costs a few small tensor ops instead of
``k`` steps of a draft model, so a round costs the target's verify and commit alone. It pays where the
output repeats the context: quoting or editing a document given in the prompt, a conversation's earlier
turns, code, and greedy decoding's own repetitions. The verify step keeps the output the target's greedy
output whatever is proposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from laquant.errors import LaquantError

MAX_NGRAM = 8


@dataclass(frozen=True)
class NgramDraft:
    """Propose the tokens that followed the latest earlier occurrence of the sequence's last ``n``
    tokens, ``n`` from ``max_ngram`` down to ``min_ngram`` (the longest match wins)."""

    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self):
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (self.max_ngram, self.min_ngram))
        if not ok or not 1 <= self.min_ngram <= self.max_ngram <= MAX_NGRAM:
            raise LaquantError(f"n-gram drafting needs 1 <= min_ngram <= max_ngram <= {MAX_NGRAM}; got "
                               f"min_ngram={self.min_ngram!r}, max_ngram={self.max_ngram!r}")

    def propose(self, context: torch.Tensor, length: torch.Tensor, k: int) -> torch.Tensor:
        return ngram_proposals(context, length, k, self.max_ngram, self.min_ngram)


def as_draft(draft):
    """``"ngram"`` as the default :class:`NgramDraft`; anything else (a draft model, an NgramDraft) as given."""
    if isinstance(draft, str):
        if draft != "ngram":
            raise LaquantError(f"a draft is a model or 'ngram' (prompt lookup), not {draft!r}")
        return NgramDraft()
    return draft


def ngram_proposals(context: torch.Tensor, length: torch.Tensor, k: int, max_ngram: int = 3,
                    min_ngram: int = 1) -> torch.Tensor:
    """``k`` proposed tokens ``[B, k]`` for each row of ``context [B, L]``, whose first ``length`` tokens
    (a device scalar, the same for every row) are the sequence so far.

    For the largest ``n`` in ``max_ngram .. min_ngram`` whose last ``n`` tokens occur earlier (a start
    ``s <= length - n - 1``, so at least one token follows it), the latest such ``s`` is taken and the
    tokens after it are proposed: ``context[s + n + (j mod P)]`` for ``j < k``, ``P = length - n - s``.
    Past the known tokens the match's period ``P`` continues the sequence (a loop of ``P`` tokens goes
    on looping). A row without a match proposes its last token ``k`` times (token 0 while ``length`` is
    0: a captured round's warm-up runs on an empty context). No host sync: capturable in a CUDA graph."""
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


__all__ = ["NgramDraft", "as_draft", "ngram_proposals"]
