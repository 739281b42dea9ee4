"""A multi-turn chat workload replayed with and without the prefix state cache (``laquant eval serve``).

The workload (synthetic token ids): a shared system prompt of ``system`` tokens; ``conversations``
chats, each a user message of ``user`` tokens per turn and a greedy reply of ``reply`` tokens, for
``turns`` turns; turn ``r`` of a chat sends its whole history. Requests go turn by turn across the
chats (as a server sees them), one at a time. Time to first token (TTFT) is prefill + the first
token's choice; the rest of the reply is the decode, through the ``decode`` callable
(:func:`greedy_decode` by default, or :class:`SpeculativeDecode`: a draft model proposes, the
model verifies; its replies are the greedy ones).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from laquant.adapters import cache_kwargs, new_cache, returned_cache
from laquant.serving.graphed_prefill import graphs_on_this_device
from laquant.serving.model_state import vocab_size
from laquant.serving.prefix_cache import PrefixStateCache

# decode(model, cache, first [1], steps, prompt [T]) -> the ``steps`` tokens after ``first``, LongTensor [1, steps]
Decode = Callable[[torch.nn.Module, object, torch.Tensor, int, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Workload:
    system: int = 4096
    conversations: int = 4
    turns: int = 3
    user: int = 64
    reply: int = 32
    seed: int = 0


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def greedy_decode(model, cache, first: torch.Tensor, steps: int, prompt: torch.Tensor | None = None) -> torch.Tensor:
    """``steps`` greedy tokens after ``first`` ``[1]`` from ``cache``: one CUDA graph replay per
    step where laquant's generate can graph the model (on CUDA: laquant's models, a transformers hybrid), else the
    eager loop. (``prompt``: unused, the draft's in :class:`SpeculativeDecode`.)"""
    from laquant.errors import LaquantError
    from laquant.generate import _graph_for, is_graphable  # the captured step generate() uses
    from laquant.moe_experts import decode_experts_implementation, experts_implementation

    if steps <= 0:
        return first.new_zeros(1, 0)
    if is_graphable(model):
        try:
            graph = _graph_for(model, cache, 1, steps + 1, (False, 1.0, None, None), lambda x: x.argmax(-1), None)
        except (LaquantError, ValueError):  # a state format without a decode kernel: eager
            graph = None
        if graph is not None:
            graph.load(cache, first)
            for _ in range(steps):
                graph.graph.replay()
            return graph.history[:, 1:steps + 1].clone()
    out, tok = [], first
    # the eager steps run the MoE experts as the captured ones would
    experts = decode_experts_implementation(model, 1) if first.is_cuda else None
    with torch.no_grad(), experts_implementation(model, experts):
        for _ in range(steps):
            logits = model(input_ids=tok[:, None], **cache_kwargs(model, cache), use_cache=True).logits[:, -1]
            tok = logits.argmax(-1)
            out.append(tok)
    return torch.stack(out, 1)


class SpeculativeDecode:
    """The replay's decode by greedy speculative decoding (:mod:`laquant.serving.speculative`):
    ``draft`` prefills the request's prompt (through its own prefix cache with ``block_size``, as a
    server would keep one; that time counts as the decode's), then proposes ``num_draft_tokens`` a
    round, which the model verifies from its cache. ``draft="ngram"`` looks the proposals up in the
    request's tokens instead (no draft model, nothing to prefill). ``verify_numerics``: the model's verify
    steps' (:func:`~laquant.serving.speculative.speculative_generate`). ``stats`` sums the rounds."""

    def __init__(self, draft, num_draft_tokens: int = 4, block_size: int | None = None,
                 verify_numerics: str = "decode"):
        from laquant.serving.ngram import NgramDraft, as_draft

        self.draft, self.num_draft_tokens = as_draft(draft), num_draft_tokens
        self.verify_numerics = verify_numerics
        self.ngram = isinstance(self.draft, NgramDraft)
        self.block_size = None if self.ngram else block_size
        self.reset()

    def reset(self) -> None:
        """Zero the counts and empty the draft's prefix cache (before a timed replay)."""
        from laquant.serving.speculative import SpeculativeStats

        self.stats = SpeculativeStats()
        self.prefix_cache = PrefixStateCache(self.draft, self.block_size) if self.block_size else None

    def __call__(self, model, cache, first: torch.Tensor, steps: int, prompt: torch.Tensor) -> torch.Tensor:
        from laquant.generate import _forward, _fresh_cache
        from laquant.serving.speculative import speculative_continue

        if steps <= 0:
            return first.new_zeros(1, 0)
        if self.ngram:
            new = speculative_continue(model, self.draft, cache, None, first, steps + 1, self.num_draft_tokens,
                                       stats=self.stats, context=prompt.to(first.device)[None],
                                       verify_numerics=self.verify_numerics)
            return new[:, 1:]
        with torch.no_grad():
            if self.prefix_cache is not None:
                _, draft_cache, _ = self.prefix_cache.prefill(prompt)
            else:
                _, draft_cache = _forward(self.draft, prompt.to(first.device)[None], _fresh_cache(self.draft))
        new = speculative_continue(model, self.draft, cache, draft_cache, first, steps + 1, self.num_draft_tokens,
                                   stats=self.stats, verify_numerics=self.verify_numerics)
        return new[:, 1:]


def full_prefill(model, tokens: torch.Tensor, seed: int = 0):
    """``(logits [1, 1, vocab], cache)`` of a prefill from nothing (the no-cache baseline)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(input_ids=tokens.to(device)[None], **cache_kwargs(model, new_cache(model, seed)), use_cache=True,
                    logits_to_keep=1)
    return out.logits, returned_cache(out)


def replay(model, workload: Workload, prefix_cache: PrefixStateCache | None = None,
           decode: Decode = greedy_decode, progress: bool = False, label: str = "",
           prompts: list | None = None) -> list[dict]:
    """Serve ``workload`` request by request; one record per request (TTFT, decode time, tokens). ``prompts``: a
    list that receives each request's prompt ids (on the host)."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(workload.seed)
    vocab = vocab_size(model)
    rand = lambda n: torch.randint(0, vocab, (n,), generator=gen)  # noqa: E731
    system = rand(workload.system)
    history = [torch.cat([system, rand(workload.user)]) for _ in range(workload.conversations)]
    records = []
    total = workload.turns * workload.conversations
    with tqdm(total=total, desc=f"replay {label}".strip(), unit="req", disable=not progress, leave=False) as bar:
        for turn in range(workload.turns):
            for conv in range(workload.conversations):
                prompt = history[conv]
                _sync(device)
                t0 = time.perf_counter()
                if prefix_cache is not None:
                    logits, cache, cached = prefix_cache.prefill(prompt)
                else:
                    (logits, cache), cached = full_prefill(model, prompt), 0
                first = logits[:, -1].argmax(-1)
                first_id = int(first)  # the token is on the host: the time to first token ends here
                t1 = time.perf_counter()
                rest = decode(model, cache, first, workload.reply - 1, prompt)
                _sync(device)
                t2 = time.perf_counter()
                reply = torch.cat([torch.tensor([first_id]), rest[0].cpu()])
                history[conv] = torch.cat([prompt, reply, rand(workload.user)])
                records.append(dict(turn=turn, conversation=conv, prompt_tokens=len(prompt), cached_tokens=cached,
                                    ttft_s=t1 - t0, decode_s=t2 - t1, new_tokens=len(reply), reply=reply.tolist()))
                if prompts is not None:
                    prompts.append(prompt)
                bar.update()
    return records


def summarize(records: list[dict]) -> dict:
    ttft = [r["ttft_s"] for r in records]
    decode_s = sum(r["decode_s"] for r in records)
    decoded = sum(r["new_tokens"] - 1 for r in records)
    wall = sum(r["ttft_s"] + r["decode_s"] for r in records)
    return dict(requests=len(records), ttft_mean_s=statistics.fmean(ttft), ttft_median_s=statistics.median(ttft),
                decode_tokens_per_s=decoded / decode_s if decode_s else None,
                tokens_per_s=sum(r["new_tokens"] for r in records) / wall,
                prompt_tokens=sum(r["prompt_tokens"] for r in records),
                cached_tokens=sum(r["cached_tokens"] for r in records))


def follow_up_ttft(model, system: int, user: int, block_size: int, reps: int = 5, state_format: str | None = None,
                   seed: int = 0) -> dict:
    """TTFT of a follow-up request (a shared ``system``-token prefix, then ``user`` new tokens):
    a full prefill against a prefill resumed from the cached prefix (median of ``reps`` requests,
    each with fresh user tokens, after one untimed request of each kind), and where the model
    allows it that resumed prefill replayed as a CUDA graph (``graphed_*``, else None); also a cold
    request (a new prefix) through the cache, which writes its snapshots: what caching costs a miss."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    vocab = vocab_size(model)
    shared = torch.randint(0, vocab, (system,), generator=gen)
    first = torch.cat([shared, torch.randint(0, vocab, (user,), generator=gen)])
    pools = {"cached": PrefixStateCache(model, block_size, budget_bytes=1 << 40, state_format=state_format, seed=seed,
                                        graphed=False)}
    suffix = system + user - (system + user - 1) // block_size * block_size  # what a hit leaves to run
    if 1 < suffix < block_size and graphs_on_this_device(model):  # the same request's prefill, graphed
        pools["graphed"] = PrefixStateCache(model, block_size, budget_bytes=1 << 40, state_format=state_format,
                                            seed=seed, graphed=True)
    for pool in pools.values():
        pool.prefill(first)  # caches the prefix
    kinds = ("full", *pools, "cold")
    times = {kind: [] for kind in kinds}
    cached_tokens = 0
    for i in range(reps + 1):
        prompt = torch.cat([shared, torch.randint(0, vocab, (user,), generator=gen)])
        fresh = torch.randint(0, vocab, (system + user,), generator=gen)
        for kind in kinds:
            _sync(device)
            t0 = time.perf_counter()
            if kind == "full":
                logits, _ = full_prefill(model, prompt, seed)
            elif kind == "cold":
                logits, _, _ = pools["cached"].prefill(fresh)
            else:
                logits, _, cached_tokens = pools[kind].prefill(prompt)
            int(logits[:, -1].argmax(-1))
            if i:  # the first of each kind is a warm-up (and the graph's capture)
                times[kind].append(time.perf_counter() - t0)
    full, cached = statistics.median(times["full"]), statistics.median(times["cached"])
    failure = pools["graphed"].graphed_prefill.failure if "graphed" in pools else None
    graphed = statistics.median(times["graphed"]) if "graphed" in pools and failure is None else None
    return dict(system=system, user=user, block_size=block_size, reps=reps, cached_tokens=cached_tokens,
                state_format=state_format or "model", full_prefill_ttft_s=full, cached_ttft_s=cached,
                speedup=full / cached, graphed_cached_ttft_s=graphed,
                graphed_speedup=full / graphed if graphed else None, graphed_failure=failure,
                cold_with_snapshots_ttft_s=statistics.median(times["cold"]))


def snapshot_memory(model, formats, block_size: int, budget_bytes: int) -> list[dict]:
    """Bytes of one snapshot per state format, and how many fit in ``budget_bytes``."""
    rows = []
    probe = torch.randint(0, vocab_size(model), (block_size + 1,), generator=torch.Generator().manual_seed(0))
    for fmt in formats:
        pool = PrefixStateCache(model, block_size, state_format=fmt)
        pool.prefill(probe)
        size = pool.snapshot_bytes()
        rows.append(dict(format=fmt, snapshot_bytes=size, snapshots_in_budget=budget_bytes // size))
    fp32 = next((r["snapshots_in_budget"] for r in rows if r["format"] == "fp32"), None)
    for r in rows:
        r["vs_fp32"] = r["snapshots_in_budget"] / fp32 if fp32 else None
    return rows


def first_partings(model, greedy: list[dict], other: list[dict], prompts: list) -> list[dict]:
    """Where each conversation's replies in ``other`` first part from the ``greedy`` replay's (the same prompt
    there: the histories agree until then): ``request``, ``position`` in the reply, and ``gap``, the model's
    logits of the two tokens apart over its largest logit (:func:`~laquant.serving.speculative.parting_gaps`).
    A conversation's later replies continue from other histories and are not measured."""
    from laquant.serving.speculative import parting_gaps

    device = next(model.parameters()).device
    out, seen = [], set()
    for i, (a, b) in enumerate(zip(greedy, other)):
        if a["reply"] == b["reply"] or a["conversation"] in seen:
            continue
        seen.add(a["conversation"])
        want, got = (torch.cat([prompts[i], torch.tensor(r["reply"])])[None].to(device) for r in (a, b))
        for _, position, gap in parting_gaps(model, got, want):
            out.append(dict(request=i, position=position - len(prompts[i]), gap=gap))
    return out


def serve_eval(model, workload: Workload, block_size: int, budget_bytes: int, formats, reps: int = 5,
               decode: Decode = greedy_decode, progress: bool = True,
               speculative: SpeculativeDecode | None = None) -> dict:
    """The replay with and without the cache (snapshots in the model's state format; for laquant's
    own models on CUDA also with short prefills replayed as CUDA graphs), the follow-up TTFT and the snapshot
    memory per format; with ``speculative``, the cached replay again with it
    as the decode, and whether its replies were the greedy ones (on CUDA a near-tie of two logits
    may part them: the GEMMs of a verify and of a decode step round apart)."""
    # the same request shapes with other tokens, untimed: Triton compiles a kernel per argument
    # specialisation (lengths divisible by 16 or not, ...), seconds per first sight that the timed
    # requests must not pay (a 3 s request once made the mean TTFT on hits worse than no cache)
    warm = Workload(**{**asdict(workload), "seed": workload.seed + 1})
    graphed = graphs_on_this_device(model)
    for dec in (decode, speculative) if speculative is not None else (decode,):
        replay(model, warm, None, dec)
        replay(model, warm, PrefixStateCache(model, block_size, seed=workload.seed, graphed=False), dec)
    base = replay(model, workload, None, decode, progress, "no cache")
    pool = PrefixStateCache(model, block_size, budget_bytes=budget_bytes, seed=workload.seed, graphed=False)
    prompts = []
    cached = replay(model, workload, pool, decode, progress, "prefix cache", prompts)
    extra = {}
    if graphed:  # prefills adding fewer tokens than a block replay (captured in the warm-up)
        graphs = PrefixStateCache(model, block_size, budget_bytes=budget_bytes, seed=workload.seed, graphed=True)
        replay(model, warm, graphs, decode)
        graphs.clear()
        if graphs.graphed_prefill.failure is None:  # else it ran eagerly: nothing to report as graphed
            extra["prefix_cache_graphed"] = summarize(replay(model, workload, graphs, decode, progress,
                                                             "graphed prefill"))
    if speculative is not None:
        speculative.reset()
        # the "prefix cache" replay's pool (eager prefills): the two differ in their decode only
        spec = replay(model, workload, PrefixStateCache(model, block_size, budget_bytes=budget_bytes,
                                                        seed=workload.seed, graphed=False),
                      speculative, progress, "speculative")
        parted = [i for i, (a, b) in enumerate(zip(cached, spec)) if a["reply"] != b["reply"]]
        st = speculative.stats
        extra.update(speculative=summarize(spec), speculation=dict(
            num_draft_tokens=speculative.num_draft_tokens, verify_numerics=speculative.verify_numerics,
            rounds=st.rounds, proposed=st.proposed,
            accepted=st.accepted, acceptance=st.acceptance if st.proposed else None,
            tokens_per_round=st.tokens_per_round if st.rounds else None, draft_graphed=st.draft_graphed,
            round_graphed=st.round_graphed, replies_equal_greedy=not parted, requests_parted=parted,
            first_partings=first_partings(model, cached, spec, prompts)))
    hits = [i for i, r in enumerate(cached) if r["cached_tokens"]]
    hit_ttft = (statistics.fmean(base[i]["ttft_s"] for i in hits) / statistics.fmean(cached[i]["ttft_s"] for i in hits)
                if hits else None)
    return dict(workload=asdict(workload), block_size=block_size, budget_bytes=budget_bytes,
                no_cache=summarize(base), prefix_cache=summarize(cached), pool=pool.summary(),
                ttft_speedup_on_hits=hit_ttft,
                follow_up=follow_up_ttft(model, workload.system, workload.user, block_size, reps, seed=workload.seed),
                memory=snapshot_memory(model, formats, block_size, budget_bytes),
                requests=dict(no_cache=base, prefix_cache=cached,
                              **({"speculative": spec} if speculative is not None else {})),
                **extra)
