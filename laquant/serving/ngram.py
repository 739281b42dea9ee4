"""Prompt lookup: draft tokens found in the sequence itself, for speculative decoding without a draft model.

transformers calls it prompt lookup decoding (``prompt_lookup_num_tokens``), vLLM the ``ngram`` method. The
last ``n`` tokens of the sequence (prompt and tokens made so far) are looked up earlier in it; the tokens
that followed that earlier occurrence are proposed. Proposing costs one small kernel
(:mod:`laquant.kernels.ngram`) instead of ``k`` steps of a draft model, so a round costs the target's verify
and commit alone. It pays where the output repeats the context: quoting or editing a document given in the
prompt, a conversation's earlier turns, code, and greedy decoding's own repetitions. The verify step keeps
the output the target's greedy output whatever is proposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from laquant.errors import LaquantError
from laquant.kernels.ngram.lookup import ngram_lookup

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
        """``k`` proposals ``[B, k]`` from the first ``length`` tokens of ``context [B, L]``
        (:func:`laquant.kernels.ngram.reference.ngram_lookup_reference` says how; one Triton launch on CUDA)."""
        return ngram_lookup(context, length, k, self.max_ngram, self.min_ngram)


def as_draft(draft):
    """``"ngram"`` as the default :class:`NgramDraft`; anything else (a draft model, an NgramDraft) as given."""
    if isinstance(draft, str):
        if draft != "ngram":
            raise LaquantError(f"a draft is a model or 'ngram' (prompt lookup), not {draft!r}")
        return NgramDraft()
    return draft


__all__ = ["NgramDraft", "as_draft", "ngram_lookup"]
