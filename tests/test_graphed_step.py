"""transformers' generate on laquant's models with each decode step a CUDA graph replay
(laquant.models.graphed_step): the same tokens and logits as the eager steps, a cache left as eager
steps leave it, caches that take the static tensors over from each other, eager calls between graphed
steps. On the CPU the captured step runs eagerly on the static cache (its stand-in); on a GPU it replays."""

import pytest
import torch

import laquant.models.graphed_step as gs
import laquant.moe_experts as moe_experts
from laquant.adapters import cache_kwargs
from laquant.kernels.common.state import StateQuantizer
from laquant.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM, GLAConfig, GLAForCausalLM
from laquant.models.graphed_step import graph_step_allowed, release_step_graphs

VOCAB = 256


def _gla(state=None, **kw):
    torch.manual_seed(1)
    cfg = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)
    return _with_state(GLAForCausalLM(GLAConfig(**{**cfg, **kw})).eval(), state)


def _delta(state=None):
    torch.manual_seed(1)
    cfg = GatedDeltaNetConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=16, expand_v=1.5,
                              num_v_heads=4, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)
    return _with_state(GatedDeltaNetForCausalLM(cfg).eval(), state)


def _with_state(model, state):
    if state is not None:  # stochastically rounded and renormalised every 3 stores: the store counts key the bits
        for m in model.modules():
            if hasattr(m, "state_quantizer"):
                m.state_quantizer = StateQuantizer(state, renorm_interval=3, rounding="stochastic")
    return model


@pytest.fixture
def stand_in(monkeypatch):
    """Graph steps on the CPU: the step a GPU would capture runs eagerly on its static cache."""
    monkeypatch.setattr(gs, "_on_graph_device", lambda t: True)


def _hf_generate(model, ids, n, graphs: bool):
    model.laquant_graph_steps = graphs
    try:
        out = model.generate(ids, max_new_tokens=n, do_sample=False, output_logits=True, return_dict_in_generate=True)
    finally:
        del model.laquant_graph_steps
    return out.sequences, torch.stack(out.logits, 1)


def _snapshot(cache):
    return [(s.data.clone(), None if s.scale is None else s.scale.clone(), s.n_stores) for s in cache.states]


def _assert_same(a, b):
    assert a.seen_tokens == b.seen_tokens
    for (da, sa, na), (db, sb, nb) in zip(_snapshot(a), _snapshot(b)):
        assert na == nb
        assert torch.equal(da.view(torch.uint8), db.view(torch.uint8))
        assert sa is None or torch.equal(sa, sb)
    assert a.conv.keys() == b.conv.keys() and all(torch.equal(a.conv[k], b.conv[k]) for k in a.conv)


@pytest.mark.parametrize("make", [lambda: _gla(), lambda: _gla("int8_row", use_short_conv=True),
                                  lambda: _delta("fp8_row")], ids=["gla", "gla-int8-conv", "delta-fp8"])
@torch.no_grad()
def test_hf_generate_with_graph_steps_equals_eager_steps(make, stand_in):
    model = make()
    ids = torch.randint(1, VOCAB, (3, 7))
    want, want_logits = _hf_generate(model, ids, 12, graphs=False)
    assert "_laquant_step_graphs" not in model.__dict__
    got, logits = _hf_generate(model, ids, 12, graphs=True)
    assert torch.equal(got, want) and torch.equal(logits, want_logits)
    (graph,) = model.__dict__["_laquant_step_graphs"].values()
    assert isinstance(graph, gs.StepGraph)  # the steps went through it
    again, _ = _hf_generate(model, ids, 12, graphs=True)  # a second call: the same graph, a new cache adopts it
    assert torch.equal(again, want) and len(model.__dict__["_laquant_step_graphs"]) == 1


def _run(model, graphs, cache, tokens):
    return model(tokens, cache=cache, use_cache=True, logits_to_keep=1, graph_step=graphs).logits


def _alternating_calls(model, ids):
    """Two caches a and b prefilled, then (graph steps off, then on): one-token steps alternating between them
    (each first step after the other's re-adopts the static tensors), an eager 5-token call on a (which holds
    the static tensors), three steps, an eager one-token step (counted on the host as well), one more step.
    ``{graphs: (a, b, logits)}``."""
    caches = {}
    for graphs in (False, True):
        a, b = model.new_cache(), model.new_cache()
        _run(model, graphs, a, ids)
        _run(model, graphs, b, ids.flip(0))
        logits = []
        for t in range(4):
            logits.append(_run(model, graphs, a, ids[:, t:t + 1]))
            logits.append(_run(model, graphs, b, ids[:, t + 1:t + 2]))
        logits.append(_run(model, graphs, a, ids[:, :5]))
        for t in range(3):
            logits.append(_run(model, graphs, a, ids[:, t:t + 1]))
        logits.append(_run(model, False, a, ids[:, :1]))
        logits.append(_run(model, graphs, a, ids[:, 1:2]))
        caches[graphs] = (a, b, logits)
    return caches


@torch.no_grad()
def test_a_cache_after_graph_steps_is_the_eager_cache(stand_in):
    """Graph steps, then an eager multi-token call, then graph steps, on one cache: the states, store counts,
    conv inputs and token count of the same calls run eagerly; two caches taking the static tensors over from
    each other each keep their own."""
    model = _gla("int8_row", use_short_conv=True)
    ids = torch.randint(1, VOCAB, (2, 9))
    caches = _alternating_calls(model, ids)
    (ea, eb, el), (ga, gb, gl) = caches[False], caches[True]
    assert all(torch.equal(x, y) for x, y in zip(el, gl))
    _assert_same(ga, ea)
    _assert_same(gb, eb)
    assert ga.step_graph is not None and gb.step_graph is None  # a holds the static tensors, b its own copies
    release_step_graphs(model)  # a gets copies too, and goes on eagerly as before
    assert ga.step_graph is None and not ga.counts_on_host
    assert torch.equal(_run(model, False, ga, ids[:, 2:3]), _run(model, False, ea, ids[:, 2:3]))
    _assert_same(ga, ea)


ATTN = [{"layers": [0], "num_heads": 4, "num_kv_heads": 2, "window_size": 6}, {"layers": [3], "num_heads": 2}]


@pytest.mark.parametrize("attn", [ATTN, [{"layers": [1], "num_heads": 2}]], ids=["first-and-last", "middle"])
@torch.no_grad()
def test_hf_generate_with_attn_layers_takes_graph_steps(attn, stand_in, monkeypatch):
    """laquant's GLA with fla's softmax attn layers: transformers' generate's graph steps keep their keys in
    static buffers (room for ROOM more tokens, captured larger as they fill, mid-call), with the eager steps'
    tokens and logits to float32 rounding (the static step's attention groups the query heads)."""
    monkeypatch.setattr(gs, "ROOM", 8)
    model = _gla(num_hidden_layers=4, attn=attn)
    ids = torch.randint(1, VOCAB, (3, 7))
    want, want_logits = _hf_generate(model, ids, 12, graphs=False)
    assert "_laquant_step_graphs" not in model.__dict__
    got, logits = _hf_generate(model, ids, 12, graphs=True)
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
    (graph,) = model.__dict__["_laquant_step_graphs"].values()
    assert isinstance(graph, gs.StepGraph) and graph.capacity == 24  # 8 + ROOM, then 16 + ROOM: 7 + 12 fit


@torch.no_grad()
def test_a_cache_with_attn_layers_after_graph_steps_is_the_eager_cache(stand_in):
    """With attn layers (the last one among them): graph steps, an eager multi-token call and an eager one-token
    step on a cache holding the static tensors, two caches taking them over from each other: the token counts,
    keys and states of the same calls run eagerly (to float32 rounding: the static step's attention is another
    formula), each cache's own after release."""
    model = _gla(num_hidden_layers=4, attn=ATTN)
    ids = torch.randint(1, VOCAB, (2, 9))
    caches = _alternating_calls(model, ids)
    (ea, eb, el), (ga, gb, gl) = caches[False], caches[True]
    for x, y in zip(el, gl):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    assert ga.step_graph is not None and gb.step_graph is None
    for got, want in ((ga, ea), (gb, eb)):
        assert got.seen_tokens == want.seen_tokens == (9 + 4 + 5 + 3 + 1 + 1 if got is ga else 9 + 4)
        assert sorted(got.kv) == sorted(want.kv) == [0, 3]
        for i in got.kv:
            torch.testing.assert_close(got.kv[i][0], want.kv[i][0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got.kv[i][1], want.kv[i][1], atol=1e-5, rtol=1e-5)
        for s, e in zip(got.states, want.states):
            assert (s is None) == (e is None)
            if s is not None:
                assert s.n_stores == e.n_stores
                torch.testing.assert_close(s.data, e.data, atol=1e-5, rtol=1e-5)
    buffers = ga.step_graph.static.static_kv
    assert all(ga.kv[i][0].data_ptr() == buffers[i][0].data_ptr() for i in buffers)  # views of the static keys
    release_step_graphs(model)  # a gets copies of the keys too, and goes on eagerly as before
    assert ga.step_graph is None and all(ga.kv[i][0].data_ptr() != buffers[i][0].data_ptr() for i in buffers)
    torch.testing.assert_close(_run(model, False, ga, ids[:, 3:4]), _run(model, False, ea, ids[:, 3:4]), atol=1e-5,
                               rtol=1e-5)
    assert ga.seen_tokens == ea.seen_tokens


def test_graphs_made_under_inference_mode_serve_later_calls(stand_in):
    """A first generate under torch.inference_mode, then one without: the static tensors are normal tensors
    (an inference tensor cannot be updated in place outside inference mode)."""
    model = _gla("int8_row")
    ids = torch.randint(1, VOCAB, (2, 5))
    want, _ = _hf_generate(model, ids, 6, graphs=False)
    with torch.inference_mode():
        first, _ = _hf_generate(model, ids, 6, graphs=True)
    with torch.no_grad():
        second, _ = _hf_generate(model, ids, 6, graphs=True)
    assert torch.equal(first, want) and torch.equal(second, want)


@torch.no_grad()
def test_a_model_moved_after_a_capture_captures_again(stand_in):
    """New parameter storage (here a dtype change) is a new graph; the one captured on the old storage is released."""
    model = _gla()
    ids = torch.randint(1, VOCAB, (2, 5))
    _hf_generate(model, ids, 4, graphs=True)
    (old,) = model.__dict__["_laquant_step_graphs"].values()
    model.double()
    want, _ = _hf_generate(model, ids, 4, graphs=False)
    got, _ = _hf_generate(model, ids, 4, graphs=True)
    assert torch.equal(got, want)
    (new,) = model.__dict__["_laquant_step_graphs"].values()
    assert new is not old and old.owner is None and new.static.states[0].data.dtype == torch.float32  # fp32 state


@torch.no_grad()
def test_which_steps_replay(stand_in, monkeypatch):
    model = _gla()
    cache = model.new_cache()
    model(torch.randint(1, VOCAB, (2, 5)), cache=cache, use_cache=True)
    one = torch.randint(1, VOCAB, (2, 1))
    assert graph_step_allowed(model, one, cache, None, 1)
    assert not graph_step_allowed(model, torch.randint(1, VOCAB, (2, 3)), cache, None, 1)  # a prefill
    assert not graph_step_allowed(model, one, cache, one, 1)  # labels
    assert not graph_step_allowed(model, one, cache, None, 0)  # every position's logits
    assert not graph_step_allowed(model, one, None, None, 1)
    assert not graph_step_allowed(model, one, model.new_cache(), None, 1)  # no states yet
    with torch.enable_grad():
        assert not graph_step_allowed(model, one, cache, None, 1)
    model.laquant_graph_steps = False
    assert not graph_step_allowed(model, one, cache, None, 1)
    del model.laquant_graph_steps
    monkeypatch.setenv("LAQUANT_GRAPH_STEPS", "0")
    assert not graph_step_allowed(model, one, cache, None, 1)
    monkeypatch.delenv("LAQUANT_GRAPH_STEPS")
    model.train()
    assert not graph_step_allowed(model, one, cache, None, 1)
    model.eval()
    monkeypatch.setattr(gs, "_on_graph_device", lambda t: False)  # the CPU without the stand-in
    assert not graph_step_allowed(model, one, cache, None, 1)


@torch.no_grad()
def test_a_step_that_cannot_be_static_runs_eagerly(stand_in, monkeypatch):
    """A cache whose layers were stored different numbers of times cannot be static: that key runs eagerly
    (remembered), with the eager step's logits."""
    model = _gla()
    ids = torch.randint(1, VOCAB, (1, 4))
    cache = model.new_cache()
    model(ids, cache=cache, use_cache=True)
    cache.states[0].n_stores += 1
    want = model(ids[:, :1], cache=_copy(cache), use_cache=True, logits_to_keep=1).logits
    got = model(ids[:, :1], cache=cache, use_cache=True, logits_to_keep=1, graph_step=True).logits
    assert torch.equal(got, want)
    assert list(model.__dict__["_laquant_step_graphs"].values()) == [False] and cache.step_graph is None


def _copy(cache):
    from laquant.kernels.common.state import State

    out = type(cache)(len(cache.states), cache.seed)
    out.states = [State(s.data.clone(), None if s.scale is None else s.scale.clone(), s.format, s.n_stores)
                  for s in cache.states]
    out.seen_tokens = cache.seen_tokens
    return out


@pytest.mark.parametrize("family", ["qwen3_next", "bamba", "qwen3_5_moe", "nemotron_h", "zamba2", "minimax"])
@torch.no_grad()
def test_hf_generate_on_a_hybrid_with_graph_steps(family, stand_in):
    """A transformers hybrid with laquant's mixers: the static cache's step (its keys in buffers, the mask
    and positions on the device) for transformers' own."""
    graph = _generate_as_eagerly(_hybrid(family), torch.randint(1, 100, (2, 7)), 8)
    assert isinstance(graph, gs.StepGraph) and graph.capacity == 2048  # the prompt and 1,024 more, rounded up


@pytest.mark.parametrize("family", ["minimax", "qwen3_next"])
@torch.no_grad()
def test_graph_steps_read_each_expert_once(family, stand_in, monkeypatch):
    """transformers' generate switches MoE experts from grouped_mm to batched_mm for its decode steps on a GPU
    (a copy of the chosen experts' weights per token and expert); a graph step copying more than
    BATCHED_MM_MAX_BYTES of a layer's experts runs grouped_mm (each chosen expert read once), a smaller one keeps
    batched_mm; the eager prefill and the model's setting after the call stay transformers' (the switch made here
    as transformers makes it on CUDA)."""
    from contextlib import contextmanager

    from transformers.generation.utils import GenerationMixin

    @contextmanager
    def switch_on_any_device(self):
        before = self.get_experts_implementation()
        self.set_experts_implementation({k: "batched_mm" if v == "grouped_mm" else v for k, v in before.items()})
        try:
            yield
        finally:
            self.set_experts_implementation(before)

    model = _hybrid(family)
    assert model.get_experts_implementation()[""] == "grouped_mm"
    ran = []
    experts = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    assert experts
    for m in experts:
        m.register_forward_pre_hook(lambda mod, args: ran.append(mod.config._experts_implementation))
    per_expert = max(sum(w[0].numel() * w.element_size() for w in (m.gate_up_proj, m.down_proj)) for m in experts)
    ids = torch.randint(1, 100, (3, 7))
    with monkeypatch.context() as patch:
        patch.setattr(GenerationMixin, "_optimize_model_for_decode", switch_on_any_device)
        want, _ = _hf_generate(model, ids, 6, graphs=False)
        assert set(ran) == {"grouped_mm", "batched_mm"}  # the eager steps: transformers' switch took
        for limit, steps_run in ((3 * 2 * per_expert, "batched_mm"), (3 * 2 * per_expert - 1, "grouped_mm")):
            monkeypatch.setattr(moe_experts, "BATCHED_MM_MAX_BYTES", limit)  # B = 3, top-2
            release_step_graphs(model)
            ran.clear()
            got, _ = _hf_generate(model, ids, 6, graphs=True)
            assert torch.equal(got, want)
            prefill, steps = ran[:len(experts)], ran[len(experts):]
            assert set(prefill) == {"grouped_mm"} and set(steps) == {steps_run}, limit
            assert isinstance(next(iter(model.__dict__["_laquant_step_graphs"].values())), gs.StepGraph)
            assert model.get_experts_implementation()[""] == "grouped_mm"
    release_step_graphs(model)
    model.set_experts_implementation("batched_mm")  # a model set to batched_mm by its user: the same rule
    ran.clear()
    got, _ = _hf_generate(model, ids, 6, graphs=True)
    assert torch.equal(got, want) and set(ran) == {"batched_mm", "grouped_mm"}
    assert model.get_experts_implementation()[""] == "batched_mm"


@torch.no_grad()
def test_a_hybrid_generate_longer_than_the_key_buffers(stand_in, monkeypatch):
    """Key buffers with room for 4 more tokens: a generate of 12 captures larger ones as they fill, mid-call,
    with the eager steps' tokens."""
    monkeypatch.setattr(gs, "ROOM", 4)
    graph = _generate_as_eagerly(_hybrid("qwen3_next"), torch.randint(1, 100, (2, 6)), 12)
    assert graph.capacity == 20  # 8, then 12, 16, 20: each captured when the last was full


def _generate_as_eagerly(model, ids, n):
    """A hybrid's generate with graph steps against the eager steps: the same tokens, logits to float32 rounding
    (the static step's attention groups the query heads); returns the one graph it captured."""
    want, want_logits = _hf_generate(model, ids, n, graphs=False)
    got, logits = _hf_generate(model, ids, n, graphs=True)
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
    (graph,) = model.__dict__["_laquant_step_graphs"].values()
    return graph


@torch.no_grad()
def test_a_hybrid_cache_after_graph_steps_goes_on_eagerly(stand_in):
    """The cache transformers' generate returns holds the static states and views of the static keys; a
    second generate takes them over (the first keeps copies); both go on eagerly as the eager runs'
    caches do."""
    model = _hybrid("qwen3_next")
    ids = torch.randint(1, 100, (2, 7))
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    results = {}
    for graphs in (False, True):
        model.laquant_graph_steps = graphs
        first = model.generate(ids, **kw)
        second = model.generate(ids.flip(0), **kw)
        del model.laquant_graph_steps
        steps = []
        for out in (first, second):
            cache = out.get("cache", out.get("past_key_values"))
            n = out.sequences.shape[1]
            tok = out.sequences[:, -1:]
            positions = torch.full((2, 1), n - 1)
            for t in range(2):
                steps.append(model(input_ids=tok, **cache_kwargs(model, cache), position_ids=positions + t,
                                   use_cache=True).logits)
        results[graphs] = (first, second, steps)
    (_, _, eager), (first, second, graphed) = results[False], results[True]
    for a, b in zip(graphed, eager):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    (graph,) = model.__dict__["_laquant_step_graphs"].values()
    buffers = {k.data_ptr() for k, _ in graph.static.kv.values()}
    kept = [getattr(layer, "keys", None) for layer in first.get("cache", first.get("past_key_values")).layers]
    kept = {k.data_ptr() for k in kept if isinstance(k, torch.Tensor) and k.numel()}
    assert kept and not kept & buffers  # the first cache holds copies
    cache = second.get("cache", second.get("past_key_values"))  # holds the static tensors
    store, n = cache.laquant_states, second.sequences.shape[1]
    # the last token was not in the cache; the two steps above, with positions of their own, are counted
    assert store.counts_on_host and store.seen_tokens == n + 1
    stores = [s.n_stores for s in store.states.values()]
    model(input_ids=second.sequences[:, -1:], **cache_kwargs(model, cache), use_cache=True)  # positions by the hook
    assert store.seen_tokens == n + 2 and [s.n_stores for s in store.states.values()] == [k + 1 for k in stores]


def _left_padded(B: int = 3, T: int = 7, pads=(3, 0, 1)):
    torch.manual_seed(3)
    ids = torch.randint(1, 100, (B, T))
    mask = torch.ones_like(ids)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _generate_padded(model, ids, mask, n, graphs: bool):
    model.laquant_graph_steps = graphs
    try:
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
    finally:
        del model.laquant_graph_steps
    return out.sequences, torch.stack(out.logits, 1)


@pytest.mark.parametrize("family", ["qwen3_next", "bamba", "nemotron_h", "zamba2", "minimax", "kimi_linear",
                                    "falcon_h1"])
@torch.no_grad()
def test_hf_generate_on_a_left_padded_batch_takes_graph_steps(family, stand_in):
    """Prompts of several lengths, left-padded: the decode steps replay a graph of their own (each sequence's
    padded keys masked, its positions its own), with the eager steps' tokens and logits, and each sequence's are
    those it gets alone (MiniMax's eager steps too: laquant hands transformers' generate its cache class)."""
    model = _hybrid(family)
    ids, mask = _left_padded()
    want, want_logits = _generate_padded(model, ids, mask, 6, graphs=False)
    got, logits = _generate_padded(model, ids, mask, 6, graphs=True)
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
    (graph,) = model.__dict__["_laquant_step_graphs"].values()
    assert isinstance(graph, gs.StepGraph) and graph.padded
    for row in (0, 2):  # the padded sequences, alone
        pad = int((mask[row] == 0).sum())
        alone, alone_logits = _hf_generate(model, ids[row:row + 1, pad:], 6, graphs=True)
        assert torch.equal(got[row, pad:], alone[0])
        torch.testing.assert_close(logits[row], alone_logits[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("make", [lambda: _gla(use_short_conv=True), lambda: _delta("fp8_row")],
                         ids=["gla-conv", "delta"])
@torch.no_grad()
def test_hf_generate_on_a_left_padded_batch_of_laquants_models_takes_graph_steps(make, stand_in):
    """laquant's own models take the padding in the prefill (as no token); their decode steps, whose tokens are all
    real, replay the unpadded step's graph."""
    model = make()
    ids, mask = _left_padded(T=9)
    want, want_logits = _generate_padded(model, ids, mask, 6, graphs=False)
    got, logits = _generate_padded(model, ids, mask, 6, graphs=True)
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
    (graph,) = model.__dict__["_laquant_step_graphs"].values()
    assert isinstance(graph, gs.StepGraph) and not graph.padded


@torch.no_grad()
def test_a_padded_graph_follows_the_padding_it_is_given(stand_in):
    """The cache that holds a padded graph's tensors continues it only while the mask keeps the padding it adopted
    (every later position attended); another padding, or none, is loaded again or takes the unpadded graph."""
    model = _hybrid("qwen3_next")
    ids, mask = _left_padded()
    _generate_padded(model, ids, mask, 3, graphs=True)
    (graph,) = model.__dict__["_laquant_step_graphs"].values()
    n = graph.keys.shape[1]
    longer = torch.cat([graph.keys, torch.ones(3, 2, dtype=torch.bool)], 1)
    assert graph._same_padding(longer) and not graph._same_padding(None)
    other = longer.clone()
    other[1, 0] = False
    assert not graph._same_padding(other)
    hole = longer.clone()
    hole[0, n] = False
    assert not graph._same_padding(hole)
    _generate_padded(model, ids, torch.ones_like(mask), 3, graphs=True)  # unpadded: a graph of its own
    assert sorted(g.padded for g in model.__dict__["_laquant_step_graphs"].values()) == [False, True]


@torch.no_grad()
def test_a_static_cache_takes_a_padding_only_where_it_was_made_for_one():
    from laquant.models.static_hybrid import StaticHybridCache
    from test_static_hybrid import _prefilled

    model = _hybrid("qwen3_next")
    cache = _prefilled(model, torch.randint(1, 100, (2, 5)))
    keys = torch.ones(2, 5, dtype=torch.bool)
    keys[0, :2] = False
    with pytest.raises(ValueError, match="padded static cache"):
        StaticHybridCache.from_cache(cache, 16, keys=keys)
    static = StaticHybridCache.from_cache(cache, 16, padded=True, keys=keys)
    assert static.positions.tolist() == [[3], [5]]  # each sequence's attended positions so far
    row = static.mask[0, 0, 0]
    assert (row[:2] == torch.finfo(row.dtype).min).all() and (row[2:5] == 0).all()
    with pytest.raises(ValueError, match="padded static cache"):
        StaticHybridCache.from_cache(cache, 16, padded=True, keys=keys[:, :4])


@pytest.mark.parametrize("graphs", [False, True])
@torch.no_grad()
def test_a_hybrid_cache_goes_on_without_positions_after_generate(graphs, stand_in):
    """transformers' generate passes the positions; a later call on its cache without them continues
    at the cache's length (laquant counts the tokens of both kinds of call), as one with them does."""
    model = _hybrid("qwen3_next")
    ids = torch.randint(1, 100, (2, 7))
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    model.laquant_graph_steps = graphs
    logits = []
    for positions in (True, False):
        out = model.generate(ids, **kw)
        cache, n = out.get("cache", out.get("past_key_values")), out.sequences.shape[1]
        assert cache.laquant_states.seen_tokens == n - 1
        extra = dict(position_ids=torch.full((2, 1), n - 1)) if positions else {}
        logits.append(model(input_ids=out.sequences[:, -1:], **cache_kwargs(model, cache), use_cache=True,
                            **extra).logits)
    del model.laquant_graph_steps
    torch.testing.assert_close(logits[1], logits[0], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", ["gla", "hybrid"])
@torch.no_grad()
def test_a_model_with_graph_steps_is_freed_by_del(kind, stand_in):
    """No reference cycle through the graphs or the hybrid's wrapped methods: ``del model`` frees the model
    (its weights) at once, without the garbage collector; a deep copy's methods are the copy's."""
    import copy
    import gc
    import weakref

    model = _gla() if kind == "gla" else _hybrid("qwen3_next")
    _hf_generate(model, torch.randint(1, 100, (2, 5)), 4, graphs=True)
    assert model.__dict__["_laquant_step_graphs"]
    twin = copy.deepcopy(model)
    if kind == "hybrid":
        assert twin.forward.ref() is twin and twin.prepare_inputs_for_generation.ref() is twin
    ref = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert ref() is None
    finally:
        gc.enable()
    got, _ = _hf_generate(twin, torch.randint(1, 100, (2, 5)), 4, graphs=True)
    assert got.shape == (2, 9)


def _hybrid(family):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_static_hybrid import _installed

    return _installed(family)


# ------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "gla_int8_all"])
@torch.no_grad()
def test_gpu_hf_generate_replays_with_the_eager_logits(recipe):
    import laquant

    torch.manual_seed(0)
    cfg = GLAConfig(hidden_size=256, num_hidden_layers=3, num_heads=2, vocab_size=4096, bos_token_id=0,
                    eos_token_id=0)
    with torch.device("cuda"):
        model = GLAForCausalLM(cfg)
    model = model.to(torch.bfloat16).eval()
    if recipe is not None:
        laquant.calibrate(model, recipe, torch.randint(0, 4096, (4, 256), device="cuda"), progress=False)
    for B, n in ((3, 30), (1, 12), (3, 9)):
        ids = torch.randint(1, 4096, (B, 17), device="cuda")
        want, want_logits = _hf_generate(model, ids, n, graphs=False)
        with torch.inference_mode(B == 1):  # the B = 1 graph is captured under inference mode, replayed without it
            got, logits = _hf_generate(model, ids, n, graphs=True)
        assert torch.equal(got, want) and torch.equal(logits, want_logits), (B, n)
        got, logits = _hf_generate(model, ids, n, graphs=True)
        assert torch.equal(got, want) and torch.equal(logits, want_logits), (B, n)
    graphs = model.__dict__["_laquant_step_graphs"]
    assert len(graphs) == 2 and all(g.graph is not None for g in graphs.values())  # captured, once per batch size
    release_step_graphs(model)
    with torch.inference_mode():  # laquant's own graphed loop, captured under inference mode, then used without it
        from laquant.generate import generate, release_graphs

        ids = torch.randint(1, 4096, (2, 9), device="cuda")
        want = generate(model, ids, 8, graphed=False)
        assert torch.equal(generate(model, ids, 8), want)
    assert torch.equal(generate(model, ids, 8), want)
    release_graphs(model)


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_hf_generate_with_attn_layers_replays():
    """laquant's GLA with fla's softmax attn layers (GQA and a window first, plain last), bf16 on the GPU:
    generate's graph steps (the keys in static buffers, laquant's decode attention kernel) give the eager steps'
    tokens up to near-ties and, on the rows that do not part, their logits to bf16 rounding; a 1,100-token prompt
    captures key buffers of 3,072 positions (the prompt and 1,024 more, rounded up)."""
    from test_speculative import _assert_same_up_to_near_ties

    torch.manual_seed(0)
    cfg = GLAConfig(hidden_size=256, num_hidden_layers=3, num_heads=2, vocab_size=4096, bos_token_id=0,
                    eos_token_id=0, attn=[{"layers": [0], "num_heads": 4, "num_kv_heads": 2, "window_size": 40},
                                          {"layers": [2], "num_heads": 4}])
    with torch.device("cuda"):
        model = GLAForCausalLM(cfg)
    model = model.to(torch.bfloat16).eval()
    for B, T, n in ((3, 17, 20), (2, 1100, 9)):
        ids = torch.randint(1, 4096, (B, T), device="cuda")
        want, want_logits = _hf_generate(model, ids, n, graphs=False)
        got, logits = _hf_generate(model, ids, n, graphs=True)
        _assert_same_up_to_near_ties(model, got, want, T, (B, T))
        same = (got == want).all(1)
        torch.testing.assert_close(logits[same], want_logits[same], atol=5e-2, rtol=5e-2)
    graphs = model.__dict__["_laquant_step_graphs"]
    assert graphs and all(g and g.graph is not None for g in graphs.values())
    assert max(g.capacity for g in graphs.values()) == 3072
    release_step_graphs(model)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@torch.no_grad()
def test_gpu_hf_generate_on_a_hybrid_replays(dtype, monkeypatch):
    """qwen3_next (MoE) with laquant's mixers on the GPU: transformers' generate with graph steps gives the
    eager steps' tokens (logits to bf16 rounding: the static step's attention is another kernel, its experts
    grouped_mm where the eager steps run transformers' batched_mm). In float32, where grouped_mm copies from the
    host, the steps are captured with batched_mm."""
    monkeypatch.setattr(moe_experts, "BATCHED_MM_MAX_BYTES", 0)  # the tiny experts' copies would keep batched_mm
    model = _hybrid("qwen3_next").to("cuda", dtype)
    for B, n in ((3, 20), (1, 9)):
        ids = torch.randint(1, 100, (B, 13), device="cuda")
        want, want_logits = _hf_generate(model, ids, n, graphs=False)
        got, logits = _hf_generate(model, ids, n, graphs=True)
        assert torch.equal(got, want), B
        torch.testing.assert_close(logits, want_logits, atol=3e-2, rtol=3e-2)
    graphs = model.__dict__["_laquant_step_graphs"]
    assert len(graphs) == 2 and all(g.graph is not None for g in graphs.values())
    grouped = {"": "grouped_mm"} if dtype == torch.bfloat16 else None  # (the limit is 0 here)
    assert all(g.experts == grouped for g in graphs.values())
    assert model.get_experts_implementation()[""] == "grouped_mm"
    release_step_graphs(model)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_next", "nemotron_h", "minimax"])
@torch.no_grad()
def test_gpu_hf_generate_on_a_left_padded_batch_replays(family):
    """A left-padded batch on the GPU: its decode steps replay a captured graph with the eager steps' tokens
    (logits to bf16 rounding)."""
    model = _hybrid(family).to("cuda", torch.bfloat16)
    ids, mask = _left_padded()
    ids, mask = ids.cuda(), mask.cuda()
    want, want_logits = _generate_padded(model, ids, mask, 12, graphs=False)
    got, logits = _generate_padded(model, ids, mask, 12, graphs=True)
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, atol=3e-2, rtol=3e-2)
    (graph,) = model.__dict__["_laquant_step_graphs"].values()
    assert graph.padded and graph.graph is not None
    release_step_graphs(model)
