"""A prefix state cache: snapshots of a linear-attention model's state every ``block_size`` tokens,
so that a request sharing a prefix with an earlier one prefills only what is new.

A softmax model caches keys and values per token; a linear-attention layer's whole memory of the
past is its state, so a prefix is cached as a **snapshot** of every layer's state at the end of a
block (every mixer's recurrent state in a state format, the short convs' last inputs, and for a
hybrid's softmax layers, fla's or transformers', the keys and values of that block's tokens). A
prefill asks the model for its states every ``block_size`` tokens (:class:`~laquant.models.cache.CheckpointRequest`:
the chunk kernel's ``checkpoint_every`` on CUDA, :func:`~laquant.kernels.gla.chunk.chunk_gla_reference`
elsewhere; the delta rule in pieces) and this pool keeps them:

* **keys**: block ``j`` is keyed by a chained hash ``h_j = sha256(h_{j-1} || tokens of block j)``
  (vLLM's prefix caching), so a block matches only after the same whole prefix;
* **pool**: an LRU over snapshots with a budget in bytes (an 8-bit state is a quarter of fp32's,
  so four times as many snapshots fit);
* **lookup**: the longest cached prefix that leaves at least one token to run (the next token's
  logits need one); **prefill**: restore it into a fresh cache, run only the rest, keep the new
  blocks' snapshots.

Numerics (what is exact and what is not):

* A snapshot is the prefill's running float32 state at the block's end, stored once in the
  snapshot format with fresh scales (stochastic rounding keyed by the cache's seed, the batch row,
  the prefill's store count and the 64-token chunk, as the chunk kernel keys its checkpoints). On
  the same device the CUDA kernel's checkpoints (at B = 1 the start states of its sequence-parallel
  pieces) and the reference's are the same codes up to the float32 arithmetic of the two (tested
  under Triton's interpreter and on the GPU).
* fp32 snapshots: resuming equals the uninterrupted prefill up to float32 summation order (the
  suffix's matmuls are batched differently); never bit-exact by construction, within ~1e-5.
* bf16 / 8-bit snapshots: the resumed run starts from the state rounded once (relative error per
  element ``<= 2^-8`` for bf16, ``<= 2^-4`` for fp8 e4m3, ``<= 0.5 / 127`` of the row's absmax for
  int8 to nearest, one step for stochastic). That error decays with the gates through the suffix;
  the logits differ by it and nothing else.
* A restored state counts as store 0 of its sequence, so the resumed prefill's final store is store
  1, keyed as the uninterrupted prefill's final store (with stochastic rounding both draw the same
  random bits) and, with ``renorm_interval`` 1 (every shipped recipe), scaled alike; with a larger
  interval its scale is also at least the snapshot's (the quantizer's grow-only rule).
* A snapshot is rounded by the bits of the prefill that made it: one made by a prefill that itself
  resumed at token ``P0`` uses the chunk numbering from ``P0``, so snapshots of one prefix made by
  different request histories may differ by their (unbiased) rounding.

Covered: laquant's own models, bf16 or quantized by a recipe, with fla's ``attn`` softmax layers
and short convs: ``GLAForCausalLM`` (snapshots from the chunk kernel's checkpoints) and
``GatedDeltaNetForCausalLM`` / ``DeltaNetForCausalLM`` (the delta-rule chunk kernels write no
checkpoints: the prefill runs in pieces of ``block_size`` tokens, the state carried between them
in float32, so the snapshots and the numerics above are the same; not with a recipe's
``prefill_roundtrip``). And transformers' hybrids with laquant's mixers installed (qwen3_next,
qwen3_5 and its MoE and vision-language forms, olmo_hybrid, kimi_linear, bailing_hybrid, and the
Mamba2 ones: bamba, nemotron_h, granitemoehybrid, falcon_h1, zamba2): their mixers write the same
checkpoints into the ``HybridStates`` store on transformers' cache, and a snapshot adds the softmax
layers' keys and values of the block, read from and restored into transformers' per-layer KV
objects (:mod:`laquant.serving.model_state`), copied exactly; the positions continue from the
store's token count (minimax too: laquant's cache for it sizes the causal mask of a resumed
multi-token prefill by a layer that holds keys, see ``laquant.families``). One sequence per prefill.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from laquant.adapters import cache_kwargs, new_cache
from laquant.errors import LaquantError
from laquant.kernels.common.format_names import ROUNDINGS, STATE_FORMATS
from laquant.kernels.common.state import State, quantize_state
from laquant.kernels.common.state_io import CHUNK
from laquant.models.cache import CheckpointRequest, state_store
from laquant.serving.model_state import vocab_size


@dataclass
class Snapshot:
    """The model's state after ``tokens`` tokens: each recurrent layer's :class:`State` ``[1, H, K, V]``,
    each short conv's last inputs ``[1, W - 1, C]`` and each softmax layer's keys and values of this
    block's tokens only (laquant's ``[1, block, H, D]``, transformers' ``[1, H, block, D]``: restoring
    block ``j`` takes blocks ``0..j``'s)."""

    tokens: int
    states: dict = field(default_factory=dict)
    conv: dict = field(default_factory=dict)
    kv: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        tensors = [t for kv in self.kv.values() for t in kv] + list(self.conv.values())
        return sum(s.nbytes() for s in self.states.values()) + sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class Hit:
    """A lookup's answer: ``tokens`` cached (0: none) and the chain of block hashes restored from."""

    tokens: int
    chain: list[bytes]


def check_model(model):
    """A LaquantError unless ``model`` is one the prefix cache covers (see the module's "Covered");
    else its layout (:mod:`laquant.serving.model_state`)."""
    from laquant.serving.model_state import model_layout

    layout = model_layout(model)
    for mixer in layout.mixers.values():
        if mixer.prefill_roundtrip and not mixer.state_quantizer.is_plain_fp32 and _is_delta(mixer):
            raise LaquantError(f"{layout.name}'s recipe rounds the delta-rule state inside the prefill "
                               "(prefill_roundtrip); its prefix-cache snapshots are not implemented: use a recipe "
                               "without it")
    return layout


def _is_delta(mixer) -> bool:
    """A delta-rule mixer (its snapshots come from a prefill in pieces, which cannot round inside)."""
    from laquant.models.delta_net import DeltaNet
    from laquant.models.gated_deltanet import GatedDeltaNet
    from laquant.models.hybrid_mixers import GatedDeltaNetMixer, KimiDeltaAttentionMixer

    return isinstance(mixer, (GatedDeltaNet, DeltaNet, GatedDeltaNetMixer, KimiDeltaAttentionMixer))


class PrefixStateCache:
    """Snapshots of ``model``'s state every ``block_size`` tokens (a multiple of 64), at most
    ``budget_bytes`` of them (LRU). ``state_format`` / ``rounding``: how snapshots are stored (None:
    each layer's own state format, and its rounding for the scaled formats). ``seed`` is the seed of
    every cache this makes (stochastic rounding's random bits). ``graphed``: replay prefills that add fewer
    tokens than a block (a hit's, or a whole short prompt's) as CUDA graphs
    (:mod:`laquant.serving.graphed_prefill`); None (the default) does so
    where it covers the model (laquant's own recurrent models on CUDA), False never."""

    def __init__(self, model, block_size: int = 256, budget_bytes: int = 1 << 30, state_format: str | None = None,
                 rounding: str | None = None, seed: int = 0, graphed: bool | None = None):
        self.layout = check_model(model)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < CHUNK or block_size % CHUNK:
            raise LaquantError(f"block_size must be a positive multiple of {CHUNK} tokens (the chunk kernels' "
                               f"checkpoint grid); got {block_size!r}")
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise LaquantError(f"budget_bytes must be an integer >= 0; got {budget_bytes!r}")
        if state_format is not None and state_format not in STATE_FORMATS:
            raise LaquantError(f"unknown snapshot state format {state_format!r}; allowed: {', '.join(STATE_FORMATS)}")
        if rounding is not None and rounding not in ROUNDINGS:
            raise LaquantError(f"unknown rounding {rounding!r}; allowed: {', '.join(ROUNDINGS)}")
        from laquant.models.cache import check_seed

        try:
            seed = check_seed(seed)
        except ValueError as exc:
            raise LaquantError(str(exc)) from None
        self.model, self.block_size, self.budget_bytes = model, block_size, budget_bytes
        # graphed: a prefill that adds fewer tokens than a block replays as a CUDA graph
        # where laquant.serving.graphed_prefill covers the model (else it runs eagerly)
        self.graphed_prefill = None
        from laquant.serving.graphed_prefill import GraphedPrefill, graphs_on_this_device

        if graphed or (graphed is None and graphs_on_this_device(model)):
            self.graphed_prefill = GraphedPrefill(model, block_size - 1)
        self.state_format, self.rounding, self.seed = state_format, rounding, seed
        self.needs_chain = self.layout.has_attention  # softmax layers: a block's snapshot holds only its own KV
        self._root = hashlib.sha256(f"laquant-prefix/{block_size}/{state_format}/{rounding}/{seed}".encode()).digest()
        self.entries: OrderedDict[bytes, Snapshot] = OrderedDict()
        self.used_bytes = 0
        self.stats = dict(lookups=0, prompt_tokens=0, hit_tokens=0, hit_requests=0, inserted=0, evicted=0,
                          too_large=0)

    # keys and the pool

    def block_hashes(self, tokens: torch.Tensor) -> list[bytes]:
        """The chained hash of each full block of ``tokens`` (1-D)."""
        ids = tokens.detach().to("cpu", torch.int64).numpy()
        out, h = [], self._root
        for j in range(len(ids) // self.block_size):
            h = hashlib.sha256(h + ids[j * self.block_size:(j + 1) * self.block_size].tobytes()).digest()
            out.append(h)
        return out

    def lookup(self, tokens: torch.Tensor) -> Hit:
        """The longest cached prefix of ``tokens`` (1-D) shorter than ``tokens``; marks it used."""
        tokens = _one_sequence(tokens)
        hashes = self.block_hashes(tokens[:-1])
        self.stats["lookups"] += 1
        self.stats["prompt_tokens"] += len(tokens)
        hit = 0
        if self.needs_chain:  # every block's KV is needed: the run of cached blocks from the start
            while hit < len(hashes) and hashes[hit] in self.entries:
                hit += 1
        else:  # the last block's snapshot alone restores the state
            hit = next((j + 1 for j in range(len(hashes) - 1, -1, -1) if hashes[j] in self.entries), 0)
        chain = hashes[:hit]
        for h in reversed(chain if self.needs_chain else chain[-1:]):  # the root last: evicted last
            self.entries.move_to_end(h)
        if hit:
            self.stats["hit_requests"] += 1
            self.stats["hit_tokens"] += hit * self.block_size
        return Hit(hit * self.block_size, chain)

    def insert(self, key: bytes, snapshot: Snapshot) -> bool:
        """Keep ``snapshot`` under ``key``, evicting the least recently used ones to stay within the
        budget; False when it alone exceeds the budget."""
        if key in self.entries:
            self.entries.move_to_end(key)
            return True
        size = snapshot.nbytes
        if size > self.budget_bytes:
            self.stats["too_large"] += 1
            return False
        while self.used_bytes + size > self.budget_bytes:
            _, old = self.entries.popitem(last=False)
            self.used_bytes -= old.nbytes
            self.stats["evicted"] += 1
        self.entries[key] = snapshot
        self.used_bytes += size
        self.stats["inserted"] += 1
        return True

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()
        self.used_bytes = 0

    # restore and prefill

    def restore(self, hit: Hit):
        """A fresh cache (the model's, seeded with this pool's seed) holding the state after
        ``hit.tokens`` tokens: copies (the decode kernels update a state in place), each layer's state
        in its own format, counted as store 0."""
        cache = new_cache(self.model, self.seed)
        if not hit.tokens:
            return cache
        store = state_store(cache)
        snap = self.entries[hit.chain[-1]]
        for layer, stored in snap.states.items():
            fmt = self.layout.mixers[layer].state_quantizer.format.name
            data, scale = ((stored.data.clone(), None if stored.scale is None else stored.scale.clone())
                           if stored.format == fmt else quantize_state(stored.load(), fmt))
            store.states[layer] = State(data, scale, fmt, 0)
        store.conv = {key: t.clone() for key, t in snap.conv.items()}
        dim = self.layout.seq_dim
        for layer in snap.kv:
            blocks = [self.entries[h].kv[layer] for h in hit.chain]
            k, v = (torch.cat([kv[i] for kv in blocks], dim) for i in (0, 1))
            self.layout.put_kv(cache, layer, k, v)
        store.seen_tokens = hit.tokens
        return cache

    def prefill(self, input_ids: torch.Tensor, logits_to_keep: int = 1):
        """Run ``input_ids`` (``[1, T]`` or ``[T]``) from its longest cached prefix and keep the
        snapshots of its new full blocks. Returns ``(logits [1, n, vocab] of the last
        ``logits_to_keep`` positions run, cache, tokens restored)``; the cache continues the sequence
        (``model(next_ids, **cache_kwargs(model, cache))``)."""
        tokens = _one_sequence(input_ids)
        vocab = vocab_size(self.model)
        if int(tokens.min()) < 0 or int(tokens.max()) >= vocab:
            raise LaquantError(f"input_ids holds token ids outside the model's vocabulary [0, {vocab})")
        hit = self.lookup(tokens)
        cache = self.restore(hit)
        device = next(self.model.parameters()).device
        suffix = tokens[hit.tokens:].to(device)[None]
        graphs = self.graphed_prefill
        if graphs is not None and logits_to_keep == 1 and graphs.covers(cache, suffix.shape[1]):
            replayed = graphs(cache, suffix)  # fewer new tokens than a block (a hit's or a short prompt's): no snapshot
            if replayed is not None:
                return (*replayed, hit.tokens)
        store = state_store(cache)
        store.checkpoints = CheckpointRequest(self.block_size, self.state_format, self.rounding)
        with torch.no_grad():
            out = self.model(input_ids=suffix, **cache_kwargs(self.model, cache), use_cache=True,
                             logits_to_keep=logits_to_keep)
        request, store.checkpoints = store.checkpoints, None
        hashes = self.block_hashes(tokens)
        first = hit.tokens // self.block_size
        for c, key in enumerate(hashes[first:]):
            self.insert(key, self._snapshot(request, cache, first + c, c))
        return out.logits, cache, hit.tokens

    def _snapshot(self, request, cache, block: int, c: int) -> Snapshot:
        """Block ``block``'s snapshot: checkpoint ``c`` of this prefill, copied out of the batch."""
        end = (block + 1) * self.block_size
        snap = Snapshot(end)
        for layer, st in request.states.items():
            snap.states[layer] = State(st.data[0:1, c].clone(), _checkpoint_scale(st.scale, c), st.format, 0)
        snap.conv = {key: t[0:1, c].clone() for key, t in request.conv.items() if t is not None}
        dim = self.layout.seq_dim
        for layer, (k, v) in self.layout.kv(cache).items():
            snap.kv[layer] = tuple(t[0:1].narrow(dim, end - self.block_size, self.block_size).clone() for t in (k, v))
        return snap

    def snapshot_bytes(self) -> int | None:
        """Bytes of one snapshot in this pool (None while it is empty)."""
        return next(iter(self.entries.values())).nbytes if self.entries else None

    def summary(self) -> dict:
        s = dict(self.stats)
        s.update(entries=len(self.entries), used_bytes=self.used_bytes, budget_bytes=self.budget_bytes,
                 block_size=self.block_size, snapshot_bytes=self.snapshot_bytes(),
                 token_hit_rate=s["hit_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else 0.0,
                 request_hit_rate=s["hit_requests"] / s["lookups"] if s["lookups"] else 0.0)
        return s


def _checkpoint_scale(scale: torch.Tensor | None, c: int) -> torch.Tensor | None:
    """Checkpoint ``c``'s scales out of a prefill's ``[B, C, ...]`` ones; a per-tensor format
    (``fp8_tensor``) stored all checkpoints with its one scale, which each snapshot keeps."""
    if scale is None:
        return None
    return scale.clone() if scale.dim() == 0 else scale[0:1, c].clone()


def _one_sequence(input_ids) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long:
        raise LaquantError("input_ids must be a LongTensor of token ids, [T] or [1, T]")
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise LaquantError(f"the prefix state cache prefills one sequence at a time; got a batch of "
                               f"{input_ids.shape[0]} (call it once per request)")
        input_ids = input_ids[0]
    if input_ids.dim() != 1 or input_ids.numel() == 0:
        raise LaquantError(f"input_ids must hold at least one token, as [T] or [1, T]; got shape "
                           f"{tuple(input_ids.shape)}")
    return input_ids
