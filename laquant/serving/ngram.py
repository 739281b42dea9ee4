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
    length = length.reshape(())
    best_s = torch.full((B,), -1, dtype=torch.long, device=context.device)
    best_n = torch.zeros(B, dtype=torch.long, device=context.device)
    for n in range(min_ngram, max_ngram + 1):  # a longer match found later overrides a shorter one
        if n >= L:
            break
        tail = context.index_select(1, (length - n + torch.arange(n, device=context.device)).clamp(0, L - 1))
        starts = torch.arange(L - n + 1, device=context.device)
        hit = (context.unfold(1, n, 1) == tail[:, None, :]).all(-1) & (starts < length - n)
        s = torch.where(hit, starts, -1).amax(1)
        found = s >= 0
        best_s = torch.where(found, s, best_s)
        best_n = torch.where(found, n, best_n)
    period = (length - best_n - best_s).clamp(min=1)
    src = best_s[:, None] + best_n[:, None] + torch.arange(k, device=context.device) % period[:, None]
    src = torch.where((best_s >= 0)[:, None], src, (length - 1).clamp(0, L - 1))
    return context.gather(1, src)


__all__ = ["NgramDraft", "as_draft", "ngram_proposals"]
