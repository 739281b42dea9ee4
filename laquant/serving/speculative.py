"""Greedy speculative decoding with a draft model or prompt lookup, on the verify step with rollback.

Each round the draft proposes ``k`` tokens greedily; the target runs its pending token and the
``k`` proposals in one verify step (:func:`laquant.models.verify.verify`: the logits of all
``k + 1``, the cache untouched), accepts the longest prefix of proposals that its own argmax agrees
with plus its own next token, and commits its state to exactly those tokens
(:func:`~laquant.models.verify.commit`: as many decode steps would leave it). The draft is rolled
back too: it proposes on a copy of its cache, and its real cache catches up on the accepted tokens
in its next verify step. The output is the target's greedy output token for token (its states are
those of plain decoding for the same mixer inputs; only the batch of the GEMMs differs).

On CUDA a whole round is **one CUDA graph** (:class:`_RoundGraph`) on static copies of the two
caches: the draft's ``k`` decode steps on a scratch copy of its cache, the target's verify step,
the accept count computed on the device, the target's commit of that count, the draft's own verify
and commit of the same tokens (its rollback), and the new tokens written to a device-side history.
Nothing in a round syncs the host: the loop replays as many rounds as cannot overshoot
``max_new_tokens`` and then reads how far they got (one sync per batch of rounds). Where a round
cannot be captured (laquant's models with softmax ``attn`` layers, a state format without verify
kernels, ``graphed=False``) the rounds run eagerly, the draft's proposals still replaying its
graphed decode step where :mod:`laquant.generate` graphs it; a round then syncs once, to count the
accepted tokens.

Rows of a batch advance together: a round accepts the fewest proposals any row agreed with (the
target's next token for a row that agreed with more is its proposal, so every row stays greedy).

The draft may also be ``"ngram"`` (:class:`~laquant.serving.ngram.NgramDraft`, prompt lookup): the
proposals are the tokens that followed the latest earlier occurrence of the sequence's last few tokens
(prompt and output), looked up on the device. There is no draft model to run or roll back, so a round
is the target's verify and commit; the output is the same greedy output.
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass

import torch

from laquant.errors import LaquantError
from laquant.kernels.common.format_names import VERIFY_NUMERICS
from laquant.kernels.common.pool_steps import MAX_VERIFY_TOKENS
from laquant.serving.ngram import NgramDraft, as_draft

MAX_DRAFT_TOKENS = MAX_VERIFY_TOKENS - 1  # the target verifies its pending token and the proposals


@dataclass
class SpeculativeStats:
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    draft_graphed: bool = False  # the draft's proposals replayed its CUDA graph
    round_graphed: bool = False  # every round replayed one CUDA graph (the draft's steps, verify, commits)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def tokens_per_round(self) -> float:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else float("nan")


def parting_gaps(model, got: torch.Tensor, want: torch.Tensor):
    """For each row where ``got [B, T]`` parts from greedy decoding's ``want [B, T]``, in row order: ``(row, the
    first position where they part, the gap there between the model's logits of the two tokens over its largest
    logit)``, the row's prefix run alone (``inf`` where the rows part at position 0). Speculative output equals
    greedy decoding up to near-ties (gaps well under 1%): the GEMMs of a verify step and of a decode step take other
    tiles and round apart. A generator: the logits are computed for the rows asked for."""
    for b in range(got.shape[0]):
        parted = (got[b] != want[b]).nonzero().flatten()
        if not len(parted):
            continue
        p = int(parted[0])
        if p == 0:
            yield b, p, math.inf
            continue
        with torch.no_grad():
            logits = model(want[b:b + 1, :p]).logits[0, -1].float()
        yield b, p, float((logits[want[b, p]] - logits[got[b, p]]).abs() / logits.abs().max())


def check_draft(model, draft_model, num_draft_tokens: int) -> None:
    """A clear error for a draft (a model, ``"ngram"`` or an :class:`NgramDraft`) that cannot serve
    ``model``, or a draft length out of range."""
    from laquant.models.cache import GLAStateCache

    draft_model = as_draft(draft_model)
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or \
            not 1 <= num_draft_tokens <= MAX_DRAFT_TOKENS:
        raise LaquantError(f"num_draft_tokens (--draft-tokens) must be an integer in 1..{MAX_DRAFT_TOKENS} (the "
                           f"target verifies it plus one token in one step of at most {MAX_VERIFY_TOKENS}); got "
                           f"{num_draft_tokens!r}")
    ngram = isinstance(draft_model, NgramDraft)
    for role, m in (("target", model),) + (() if ngram else (("draft", draft_model),)):
        if not isinstance(getattr(m, "new_cache", lambda: None)(), GLAStateCache):
            raise LaquantError(f"speculative decoding runs on laquant's own GLA / Gated DeltaNet models; the {role} "
                               f"is {type(m).__name__}")
    if ngram:
        return
    vt, vd = model.config.vocab_size, draft_model.config.vocab_size
    if vt != vd:
        raise LaquantError(f"the draft's vocabulary ({vd} tokens) differs from the target's ({vt}): a draft must "
                           "share the target's tokenizer")
    dev_t, dev_d = next(model.parameters()).device, next(draft_model.parameters()).device
    if dev_t != dev_d:
        raise LaquantError(f"the draft is on {dev_d} and the target on {dev_t}: load both on one device")


def _copy_cache(cache):
    """A cache to propose on: the states copied (the decode kernels update them in place)."""
    from laquant.kernels.common.state import State
    from laquant.models.cache import GLAStateCache

    out = GLAStateCache(len(cache.states), cache.seed)
    out.states = [None if s is None else State(s.data.clone(), None if s.scale is None else s.scale.clone(), s.format,
                                               s.n_stores) for s in cache.states]
    out.seen_tokens, out.conv, out.kv = cache.seen_tokens, dict(cache.conv), dict(cache.kv)  # replaced, never mutated
    return out


def _propose_graphed(draft_model, draft_cache, proposals: list, k: int) -> bool:
    """The draft's proposals 2..k by replaying its captured decode step (laquant.generate's, on a
    static copy of its cache, which is the copy proposing needs); False where it cannot be captured
    (or its cache cannot be static: a model of attn layers only)."""
    from laquant.generate import _graph_for, pick_tokens

    try:
        g = _graph_for(draft_model, draft_cache, proposals[0].shape[0], k, (False, 1.0, None, None), pick_tokens,
                       None)
    except (LaquantError, ValueError):
        return False
    g.load(draft_cache, proposals[0])
    for _ in range(k - 1):
        g.graph.replay()
    proposals[1:] = list(g.history[:, 1:k].clone().unbind(1))
    return True


class _RoundGraph:
    """One captured speculative round on static caches (see the module's docstring). Device buffers:
    ``last [B]`` the target's next token (run by neither model yet), ``history [B, capacity + k + 1]``
    the tokens made (``pos`` of them valid), ``done [B]`` rows past EOS, ``accepted`` the proposals
    accepted so far; with an :class:`NgramDraft`, ``context [B, context_room]`` the prompt and the tokens
    made (``length`` of them valid), which it looks the proposals up in (``draft_cache`` is then None)."""

    def __init__(self, model, draft_model, target_cache, draft_cache, k: int, eos: int | None, capacity: int,
                 capture: bool = True, context_room: int = 0, numerics: str = "decode"):
        from laquant.generate import (_CaptureRefused, _NotInPlace, _state_tensors, capture_failure, capture_graph,
                                      warm_up_outside_capture)

        # the target holds this round in its __dict__: a weak reference back, so no cycle keeps its weights alive
        # after ``del model``; the draft is held (its weights are read by the graph) but holds nothing of ours
        self._model, self.draft_model = weakref.ref(model), draft_model
        self.ngram = draft_model if isinstance(draft_model, NgramDraft) else None
        self.k, self.eos, self.capacity, self.numerics = k, eos, capacity, numerics
        self.target = target_cache.static_copy()
        self.draft = self.scratch = None
        if self.ngram is None:
            self.draft = draft_cache.static_copy()
            self.scratch = draft_cache.static_copy()  # the draft proposes on it: its own cache waits for the verdict
        batch, device = self.target.states[0].data.shape[0], self.target.states[0].data.device
        self.context = torch.zeros(batch, context_room if self.ngram else 0, dtype=torch.long, device=device)
        self.length = torch.zeros(1, dtype=torch.long, device=device)
        self.last = torch.zeros(batch, dtype=torch.long, device=device)
        self.history = torch.zeros(batch, capacity + k + 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.accepted = torch.zeros(1, dtype=torch.long, device=device)
        self._cols = torch.arange(k + 1, device=device)
        self.graph = None  # capture=False: the rounds run eagerly (the CPU reference of the captured round)
        if not capture:
            return
        caches = tuple(c for c in (self.target, self.draft, self.scratch) if c is not None)
        tensors = [_state_tensors(c) for c in caches]
        warm_up_outside_capture(self._round)
        if any(a is not b for c, before in zip(caches, tensors) for a, b in zip(before, _state_tensors(c))):
            raise _NotInPlace("the draft's decode step does not update its states in place")
        try:
            self.graph, _ = capture_graph(self._round)
        except RuntimeError as exc:
            for c in caches:
                c.pending = None
            raise _CaptureRefused(f"the GPU refused to capture a speculative round ({capture_failure(exc)})") from exc

    @property
    def model(self):
        return self._model()

    def _round(self) -> None:
        from laquant.generate import static_forward
        from laquant.models.verify import commit, verify

        k, batch = self.k, self.last.shape[0]
        if self.ngram is not None:
            drafted = self.ngram.propose(self.context, self.length, k)
        else:
            self.scratch.load_from(self.draft)
            tok, proposals = self.last[:, None], []
            for _ in range(k):
                tok = static_forward(self.draft_model, tok, self.scratch).argmax(-1)[:, None]
                proposals.append(tok)
            drafted = torch.cat(proposals, 1)
        ids = torch.cat([self.last[:, None], drafted], 1)
        preds = verify(self.model, ids, self.target, numerics=self.numerics).argmax(-1)  # [B, k + 1]
        agree = (preds[:, :k] == drafted).int().cummin(1).values.sum(1)
        if self.eos is not None:
            agree = torch.where(self.done, k, agree)  # a finished row's tokens are EOS whatever it predicts
        n = agree.min()
        commit(self.target, n + 1)
        if self.ngram is None:
            verify(self.draft_model, ids, self.draft, logits_to_keep=1)  # the draft's rollback: the same tokens
            commit(self.draft, n + 1)
        new = preds  # up to n, every row's prediction is the proposal it agreed with; n: its own next token
        if self.eos is not None:  # after a row's EOS it gets EOS, as plain decoding's output
            after = torch.cat([self.done[:, None], preds == self.eos], 1).int().cummax(1).values[:, :-1].bool()
            new = torch.where(after, torch.full_like(preds, self.eos), preds)
            self.done |= ((new == self.eos) & (self._cols <= n)).any(1)
        self.history.index_copy_(1, self.pos + self._cols, new)
        if self.ngram is not None:
            self.context.index_copy_(1, self.length + self._cols, new)
            self.length += n + 1
        self.last.copy_(new.gather(1, n.view(1, 1).expand(batch, 1))[:, 0])
        self.pos += n + 1
        self.accepted += n

    def load(self, target_cache, draft_cache, first: torch.Tensor, context: torch.Tensor | None = None) -> None:
        """Start from the caches (``draft_cache`` None with an n-gram draft, which takes ``context [B, T]``,
        the tokens the target's cache has run) and ``first``, the target's next token."""
        self.target.load_from(target_cache)
        if self.ngram is not None:
            T = context.shape[1]
            self.context[:, :T] = context
            self.context[:, T] = first
            self.length.fill_(T + 1)
        else:
            self.draft.load_from(draft_cache)
        self.last.copy_(first)
        self.history[:, 0] = first
        self.pos.fill_(1)
        self.accepted.zero_()
        if self.eos is not None:
            torch.eq(first, self.eos, out=self.done)

    def run(self, max_new_tokens: int, stats: SpeculativeStats, eos_check_every: int) -> torch.Tensor:
        """Rounds until ``max_new_tokens`` are made (or every row has finished): ``[B, n]``, ``last``
        first. Each batch of replays is as many rounds as cannot write past the history, since a
        round makes 1 to ``k + 1`` tokens."""
        made, rounds = 1, 0
        while made < max_new_tokens:
            batch = -(-(max_new_tokens - made) // (self.k + 1))
            if self.eos is not None:
                batch = min(batch, eos_check_every)
            for _ in range(batch):
                self.graph.replay() if self.graph is not None else self._round()
            rounds += batch
            made = int(self.pos)
            if self.eos is not None and bool(self.done.all()):
                break
        for c in (self.target, self.draft):
            if c is not None:
                c.sync_counters()
        stats.rounds += rounds
        stats.proposed += rounds * self.k
        stats.accepted += int(self.accepted)
        stats.round_graphed = True
        return self.history[:, :min(made, max_new_tokens)].clone()


def _round_graph_for(model, draft_model, target_cache, draft_cache, k: int, eos: int | None,
                     max_new_tokens: int, context: torch.Tensor | None = None, numerics: str = "decode") -> _RoundGraph:
    """The captured round for this target, draft, batch, ``k``, EOS and state layouts, captured on
    first use (or for more tokens than the last capture's history holds, or, n-gram drafts, a longer
    ``context`` than its buffer holds); kept with the target's decode graphs
    (:func:`laquant.generate.release_graphs` frees both)."""
    from laquant.generate import _NotInPlace, _state_tensors, kv_room, weights_key
    from laquant.models.cache import state_layout

    graphs = model.__dict__.setdefault("_laquant_decode_graphs", {})
    capacity = max(256, 1 << (max_new_tokens - 1).bit_length())
    ngram = isinstance(draft_model, NgramDraft)
    drafter = ((draft_model,) if ngram else
               (id(draft_model), weights_key(draft_model), draft_cache.seed, state_layout(_state_tensors(draft_cache))))
    key = ("speculative", *drafter, target_cache.states[0].data.shape[0], k, eos, target_cache.seed, numerics,
           state_layout(_state_tensors(target_cache)), weights_key(model))
    # an n-gram draft's context holds the prompt, the tokens made and a round's overshoot (rounded up to 1,024
    # when captured, for later prompts)
    need = context.shape[1] + max_new_tokens + k + 1 if ngram else 0
    g = graphs.get(key)
    if isinstance(g, _NotInPlace):  # refused before: not captured again
        raise g
    if g is None or g.capacity < max_new_tokens or g.context.shape[1] < need:
        graphs.pop(key, None)
        try:
            room = kv_room(context.shape[1] + k + 1, capacity) if ngram else 0
            # normal tensors even under torch.inference_mode: a later call without it loads into them in place;
            # without autograd: with it, a model whose weights require gradients runs the differentiable
            # references, which a CUDA graph cannot capture (the rounds then ran eagerly, 20-40x slower)
            with torch.inference_mode(False), torch.no_grad():
                g = _RoundGraph(model, draft_model, target_cache, draft_cache, k, eos, capacity, context_room=room,
                                numerics=numerics)
        except _NotInPlace as exc:
            graphs[key] = exc
            raise
        graphs[key] = g
    return g


def _speculate_graphed(model, draft_model, target_cache, draft_cache, last, max_new_tokens, k, eos, stats, context,
                       numerics):
    """:func:`_speculate` as CUDA-graphed rounds; None where a round cannot be captured (a warning
    where the GPU refused it)."""
    from laquant.generate import EOS_CHECK_EVERY, _CaptureRefused, _NotInPlace, trim_after_eos

    try:
        g = _round_graph_for(model, draft_model, target_cache, draft_cache, k, eos, max_new_tokens, context, numerics)
    except (_NotInPlace, ValueError) as exc:  # in-place steps, or a cache a static one cannot hold
        if isinstance(exc, _CaptureRefused):
            warnings.warn(f"speculative rounds run eagerly: {exc}", stacklevel=4)
        return None
    with torch.no_grad():
        g.load(target_cache, draft_cache, last, context)
        return trim_after_eos(g.run(max_new_tokens, stats, EOS_CHECK_EVERY), eos)


def speculative_generate(model, draft_model, input_ids: torch.Tensor, max_new_tokens: int, num_draft_tokens: int = 4,
                         eos_token_id: int | None = None, stats: SpeculativeStats | None = None,
                         graphed: bool | None = None, verify_numerics: str = "decode") -> torch.Tensor:
    """Greedy decoding of ``model`` with ``draft_model`` (a model, or ``"ngram"`` / an
    :class:`NgramDraft`: prompt lookup) proposing ``num_draft_tokens`` a round: ``[B, T + n]``, equal
    to ``laquant.generate.generate(model, input_ids, max_new_tokens, eos_token_id=...)``. ``stats``
    (optional) counts rounds and proposed / accepted tokens. ``graphed``: None replays each round as
    one CUDA graph where the caches allow it (else, with a draft model, its graphed decode step for its
    proposals, where :mod:`laquant.generate` graphs it); False runs everything eagerly.
    ``verify_numerics``: the target's verify steps' (:func:`laquant.models.verify.verify`): ``"decode"``
    keeps the output plain greedy decoding's; ``"prefill"`` verifies faster with an 8-bit state, its
    verdicts from logits that differ from the decode steps' by the state format's rounding, so the output
    may part from plain greedy decoding's where two tokens nearly tie, and the caches hold what a prefill of
    the accepted tokens would (:func:`laquant.models.verify.verify`)."""
    from laquant.generate import _check_args, _forward, _fresh_cache

    _check_args(model, input_ids, max_new_tokens, False, 1.0, None)
    draft_model = as_draft(draft_model)
    check_draft(model, draft_model, num_draft_tokens)
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    draft_cache = None
    with torch.no_grad():
        logits, target_cache = _forward(model, input_ids, _fresh_cache(model))
        if not isinstance(draft_model, NgramDraft):
            _, draft_cache = _forward(draft_model, input_ids, _fresh_cache(draft_model))
    new = _speculate(model, draft_model, target_cache, draft_cache, logits.argmax(-1), max_new_tokens,
                     num_draft_tokens, eos_token_id, stats, graphed, input_ids, verify_numerics)
    return torch.cat([input_ids, new], 1)


def speculative_continue(model, draft_model, target_cache, draft_cache, last: torch.Tensor, max_new_tokens: int,
                         num_draft_tokens: int = 4, eos_token_id: int | None = None,
                         stats: SpeculativeStats | None = None, graphed: bool | None = None,
                         context: torch.Tensor | None = None, verify_numerics: str = "decode") -> torch.Tensor:
    """The decoding part of :func:`speculative_generate`, from two caches that have run the same
    prompt (a served request's, e.g. resumed from a prefix cache) and ``last`` ``[B]``, the target's
    next token (run through neither): ``[B, n <= max_new_tokens]`` new tokens, ``last`` first. The
    caches are not for further use: graphed rounds run on static copies and leave them as they were,
    eager rounds advance them. An n-gram draft has no cache (``draft_cache`` None) and needs ``context
    [B, T]``, the tokens the target's cache has run, to look its proposals up in. ``verify_numerics``: as
    :func:`speculative_generate`'s."""
    draft_model = as_draft(draft_model)
    check_draft(model, draft_model, num_draft_tokens)
    if isinstance(draft_model, NgramDraft) and (context is None or context.dim() != 2 or
                                                context.shape[0] != last.shape[0]):
        raise LaquantError("an n-gram draft looks its proposals up in the tokens so far: pass context [B, T], the "
                           "tokens the target's cache has run")
    return _speculate(model, draft_model, target_cache, draft_cache, last, max_new_tokens, num_draft_tokens,
                      eos_token_id, stats, graphed, context, verify_numerics)


def _speculate(model, draft_model, target_cache, draft_cache, last, max_new_tokens, num_draft_tokens, eos_token_id,
               stats, graphed, context=None, numerics="decode"):
    """:func:`speculative_continue` on checked arguments."""
    if numerics not in VERIFY_NUMERICS:
        raise LaquantError(f"verify_numerics (--verify-numerics) must be one of {', '.join(VERIFY_NUMERICS)}; got "
                           f"{numerics!r}")
    from laquant.generate import graphable_cache, is_graphable

    stats = stats if stats is not None else SpeculativeStats()
    ngram = isinstance(draft_model, NgramDraft)
    models, caches = ((model,), (target_cache,)) if ngram else ((model, draft_model), (target_cache, draft_cache))
    if graphed is not False and max_new_tokens > 1 and all(is_graphable(m) for m in models) and \
            all(graphable_cache(c) for c in caches):
        out = _speculate_graphed(model, draft_model, target_cache, draft_cache, last, max_new_tokens,
                                 num_draft_tokens, eos_token_id, stats, context, numerics)
        if out is not None:
            return out
    if ngram:
        return _speculate_ngram_eager(model, draft_model, target_cache, last, max_new_tokens, num_draft_tokens,
                                      eos_token_id, stats, context, numerics)
    return _speculate_eager(model, draft_model, target_cache, draft_cache, last, max_new_tokens, num_draft_tokens,
                            eos_token_id, stats, graphed, numerics)


def _accept(model, target_cache, last, drafted, k, done, eos_token_id, numerics):
    """One eager round's verdict on ``drafted [B, k]``: the target's verify, the accepted count ``n`` (the
    fewest proposals any row agreed with), its commit, and the round's ``n + 1`` new tokens ``[B, n + 1]``
    (EOS after a row's EOS) with the rows now done."""
    from laquant.models.verify import commit, verify

    preds = verify(model, torch.cat([last[:, None], drafted], 1), target_cache,
                   numerics=numerics).argmax(-1)  # [B, k + 1]
    agree = (preds[:, :k] == drafted).int().cummin(1).values.sum(1)  # the leading proposals it agrees with
    if done is not None:
        agree = torch.where(done, k, agree)  # a finished row's tokens are EOS whatever it predicts
    n = int(agree.min()) if k else 0
    commit(target_cache, n + 1)
    new = torch.cat([drafted[:, :n], preds[:, n:n + 1]], 1)
    if done is not None:  # after a row's EOS it gets EOS, as plain decoding's output
        after = torch.cat([done[:, None], new == eos_token_id], 1).int().cummax(1).values[:, :-1].bool()
        new = torch.where(after, torch.full_like(new, eos_token_id), new)
        done = done | (new == eos_token_id).any(1)
    return n, new, done


def _speculate_ngram_eager(model, ngram, target_cache, last, max_new_tokens, num_draft_tokens, eos_token_id, stats,
                           context, numerics):
    """Eager rounds with proposals looked up in ``context`` and the tokens made (:class:`NgramDraft`)."""
    from laquant.generate import trim_after_eos

    with torch.no_grad():
        out, made = [last[:, None]], 1
        done = last == eos_token_id if eos_token_id is not None else None
        seq = torch.cat([context.to(last.device), last[:, None]], 1)
        while made < max_new_tokens and not (done is not None and bool(done.all())):
            k = min(num_draft_tokens, max_new_tokens - made - 1)
            drafted = ngram.propose(seq, torch.tensor(seq.shape[1], device=seq.device), k) if k else \
                last.new_empty(last.shape[0], 0)
            n, new, done = _accept(model, target_cache, last, drafted, k, done, eos_token_id, numerics)
            out.append(new)
            seq = torch.cat([seq, new], 1)
            made += n + 1
            last = new[:, -1]
            stats.rounds += 1
            stats.proposed += k
            stats.accepted += n
    return trim_after_eos(torch.cat(out, 1), eos_token_id)


def _speculate_eager(model, draft_model, target_cache, draft_cache, last, max_new_tokens, num_draft_tokens,
                     eos_token_id, stats, graphed, numerics):
    """Eager rounds with a draft model (its proposals from its graphed decode step where it has one)."""
    from laquant.generate import _forward, is_graphable, trim_after_eos
    from laquant.models.verify import commit, verify

    with torch.no_grad():
        out = [last[:, None]]
        made = 1
        unseen = last[:, None]  # the tokens the draft has not run yet
        done = last == eos_token_id if eos_token_id is not None else None
        graph = graphed is not False and is_graphable(draft_model)
        while made < max_new_tokens and not (done is not None and bool(done.all())):
            k = min(num_draft_tokens, max_new_tokens - made - 1)
            proposals = []
            if k:
                draft_logits = verify(draft_model, unseen, draft_cache)[:, -1]
                commit(draft_cache, unseen.shape[1])
                proposals.append(draft_logits.argmax(-1))
                if k > 1 and graph:
                    graph = stats.draft_graphed = _propose_graphed(draft_model, draft_cache, proposals, k)
                if k > 1 and not graph:
                    scratch = _copy_cache(draft_cache)
                    for _ in range(k - 1):
                        draft_logits, scratch = _forward(draft_model, proposals[-1][:, None], scratch)
                        proposals.append(draft_logits.argmax(-1))
            drafted = torch.stack(proposals, 1) if proposals else last.new_empty(last.shape[0], 0)
            n, new, done = _accept(model, target_cache, last, drafted, k, done, eos_token_id, numerics)
            out.append(new)
            made += n + 1
            last = new[:, -1]  # what plain decoding runs next (EOS on a finished row)
            unseen = new if k else torch.cat([unseen, new], 1)
            stats.rounds += 1
            stats.proposed += k
            stats.accepted += n
    return trim_after_eos(torch.cat(out, 1), eos_token_id)


__all__ = ["MAX_DRAFT_TOKENS", "NgramDraft", "SpeculativeStats", "check_draft", "parting_gaps", "speculative_continue",
           "speculative_generate"]
