"""A resumed prefill replayed per token-count bucket (laquant.serving.graphed_prefill): the padded,
masked prefill on static tensors against the eager resumed prefill (CPU: re-run eagerly on the
same static tensors; GPU: captured as a CUDA graph), and what stays eager."""

import pytest
import torch
from conftest import INTERPRETED, rel_err, require_triton_kernels

from laquant.kernels.common.state import StateQuantizer
from laquant.models import GLAConfig, GLAForCausalLM
from laquant.serving import PrefixStateCache
from laquant.serving.graphed_prefill import bucket_for, model_graphable

BLOCK = 128
VOCAB = 97


def _model(state=None, kind="gla", **fields):
    torch.manual_seed(0)
    if kind == "gated_deltanet":
        from laquant.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

        model = GatedDeltaNetForCausalLM(GatedDeltaNetConfig(hidden_size=64, num_hidden_layers=3, num_heads=2,
                                                             head_dim=32, vocab_size=VOCAB, **fields)).eval()
    elif kind == "delta_net":
        from laquant.models import DeltaNetConfig, DeltaNetForCausalLM

        model = DeltaNetForCausalLM(DeltaNetConfig(hidden_size=64, num_hidden_layers=3, num_heads=2,
                                                   vocab_size=VOCAB, **fields)).eval()
    else:
        model = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=3, num_heads=2, vocab_size=VOCAB,
                                         **fields)).eval()
    if state is not None:
        for layer in model.model.layers:
            layer.attn.state_quantizer = StateQuantizer(state, rounding="stochastic")
    return model


def _ids(n, seed=1):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _pools(model, use_graph: bool):
    eager = PrefixStateCache(model, BLOCK, seed=3)
    graphed = PrefixStateCache(model, BLOCK, seed=3, graphed=True)
    graphed.graphed_prefill.use_graph = use_graph
    return eager, graphed


def _step(model, cache, tok):
    with torch.no_grad():
        return model(torch.tensor([[tok]], device=cache.states[0].data.device), past_key_values=cache,
                     use_cache=True).logits[:, -1]


def test_buckets():
    assert [bucket_for(t) for t in (1, 2, 64, 65, 128, 129, 255)] == [64, 64, 64, 128, 128, 256, 256]
    # multiples of 1,024 above it: a long prompt pads by less than a block of 1,024
    assert [bucket_for(t) for t in (1000, 1024, 1025, 4096, 4097, 16384)] == [1024, 1024, 2048, 4096, 5120, 16384]


def _eager_fresh(model, ids):
    with torch.no_grad():
        out = model(ids, use_cache=True, logits_to_keep=1)
    return out.logits, out.cache


def _assert_same_states(cache, ref_cache):
    for a, b in zip(cache.states, ref_cache.states):
        assert a.format == b.format and a.n_stores == b.n_stores == 1
        if a.scale is None:
            torch.testing.assert_close(a.data, b.data, atol=1e-5, rtol=1e-5)
        else:  # the same stochastic store of float32 states equal up to summation order
            # (rows of near-zero state, ~1e-11 scales, differ in relative terms more than the others)
            torch.testing.assert_close(a.scale, b.scale, atol=1e-6 * b.scale.abs().max().item(), rtol=1e-5)
            assert (a.data.int() - b.data.int()).abs().max() <= 1
            assert (a.data != b.data).float().mean() < 1e-3
    assert cache.conv.keys() == ref_cache.conv.keys()
    for key, t in cache.conv.items():
        torch.testing.assert_close(t, ref_cache.conv[key], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("state,kind,conv", [(None, "gla", False), ("int8_row", "gla", True),
                                             ("int8_row", "gated_deltanet", True), (None, "delta_net", True)])
def test_fresh_padded_replay_equals_the_eager_prefill(state, kind, conv):
    """A prompt's prefill from an empty cache (laquant.generate's ``graphed_prefill``), padded to its bucket and
    masked: the logits, the final states and short convs' inputs, the next decode step, batches of 1 and 2, the
    static tensors reused by a shorter prompt after a longer one."""
    from laquant.models.cache import GLAStateCache
    from laquant.serving.graphed_prefill import GraphedPrefill

    model = _model(state, kind, use_short_conv=conv)
    graphs = GraphedPrefill(model, 4096, use_graph=False)
    for B, T, seed in ((1, 100, 2), (1, 37, 3), (2, 64, 4), (1, 1, 5), (2, 70, 6)):
        ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))
        fresh = GLAStateCache(len(model.model.layers))
        assert graphs.covers(fresh, T)
        logits, cache = graphs(fresh, ids)
        ref_logits, ref_cache = _eager_fresh(model, ids)
        assert logits.shape == ref_logits.shape == (B, 1, VOCAB) and not logits.requires_grad
        assert rel_err(logits, ref_logits) < 1e-5
        assert cache.seen_tokens == ref_cache.seen_tokens == T and fresh.seen_tokens == 0  # the empty cache untouched
        _assert_same_states(cache, ref_cache)
        assert bool(cache.conv) == conv
        if B == 1:
            assert rel_err(_step(model, cache, 5), _step(model, ref_cache, 5)) < 1e-4
    # one capture per bucket and batch size, a fresh layout
    assert sorted(k[:3] for k in graphs.captures) == [(64, 1, "fresh"), (64, 2, "fresh"), (128, 1, "fresh"),
                                                     (128, 2, "fresh")]


def test_a_moved_or_cast_model_is_captured_again():
    """The captures are keyed by where the weights live: after ``model.double()`` (every parameter in new storage) a
    prefill captures its bucket again instead of replaying a graph on the old addresses."""
    from laquant.generate import weights_key
    from laquant.models.cache import GLAStateCache
    from laquant.serving.graphed_prefill import GraphedPrefill

    model = _model()
    graphs = GraphedPrefill(model, 4096, use_graph=False)
    ids = _ids(30)[None]
    graphs(GLAStateCache(3), ids)
    before = weights_key(model)
    model.double()
    assert weights_key(model) != before
    logits, _ = graphs(GLAStateCache(3), ids)
    assert len(graphs.captures) == 2 and logits.dtype == torch.float64
    assert rel_err(logits, _eager_fresh(model, ids)[0]) < 1e-10


def test_graphs_are_released_when_the_model_changes():
    """Moving or casting a model (``nn.Module._apply``) and quantizing it in place release its captured graphs (they
    would read the old weights' addresses); per-tensor activation scales (one scale over the padded call) make
    the model not graphable."""
    import laquant
    from laquant.generate import prefill_graphs
    from laquant.quant.modules import QuantLinear
    from laquant.serving.graphed_prefill import model_graphable

    model = _model()
    prefill_graphs(model)
    model.double()
    assert "_laquant_prefill_graphs" not in model.__dict__
    model.float()
    prefill_graphs(model)
    model.__dict__["_laquant_decode_graphs"] = {}
    laquant.calibrate(model, "gla_int8", torch.randint(0, VOCAB, (2, 64)), progress=False)
    assert not {"_laquant_prefill_graphs", "_laquant_decode_graphs"} & model.__dict__.keys()
    assert model_graphable(model)
    mlp = model.model.layers[0].mlp
    mlp.down_proj = QuantLinear.from_linear(torch.nn.Linear(mlp.down_proj.in_features, mlp.down_proj.out_features,
                                                            bias=False), torch.tensor([], dtype=torch.long),
                                            act_granularity="per_tensor")
    assert not model_graphable(model)


def test_generate_prefill_refusals(monkeypatch):
    """``laquant.generate``'s graphed prefill: refused with the reason (no CUDA here; softmax layers; a prompt past
    the cap), the eager prefill unchanged without it."""
    from laquant.errors import LaquantError
    from laquant.generate import MAX_GRAPHED_PREFILL, generate, graphed_prefill_refusal, prefill

    model = _model()
    ids = _ids(20)[None]
    with pytest.raises(LaquantError, match="CUDA graphs need a CUDA device"):
        prefill(model, ids, graphed=True)
    with pytest.raises(LaquantError, match="graphed_prefill"):
        generate(model, ids, 3, graphed_prefill=True)
    with pytest.raises(LaquantError, match="draft_model"):
        generate(model, ids, 3, graphed_prefill=True, draft_model="ngram")
    logits, cache = prefill(model, ids)
    ref_logits, ref_cache = _eager_fresh(model, ids)
    assert torch.equal(logits, ref_logits[:, -1]) and cache.seen_tokens == 20
    hybrid = _model(attn={"layers": [1], "num_heads": 2})
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the checks after the device's
    assert graphed_prefill_refusal(model, 20) is None
    assert "softmax attn layers" in graphed_prefill_refusal(hybrid, 20)
    assert str(MAX_GRAPHED_PREFILL) in graphed_prefill_refusal(model, MAX_GRAPHED_PREFILL + 1)


@pytest.mark.parametrize("state,kind,conv", [(None, "gla", False), ("int8_row", "gla", False),
                                             ("int8_row", "gla", True), ("int8_row", "gated_deltanet", True),
                                             (None, "delta_net", True)])
def test_padded_replay_equals_the_eager_resumed_prefill(state, kind, conv):
    """Suffixes of several lengths in two buckets, the bucket's static tensors reused (a shorter
    suffix after a longer one): the logits, the final states (and short convs' kept inputs) and the
    next decode step; GLA and the delta rule, with and without short convs."""
    model = _model(state, kind, use_short_conv=conv)
    prefix = _ids(2 * BLOCK)
    eager, graphed = _pools(model, use_graph=False)
    for pool in (eager, graphed):
        pool.prefill(torch.cat([prefix, _ids(3, seed=9)]))  # caches the two blocks
    for n, seed in ((100, 2), (37, 3), (64, 4), (2, 5), (127, 6)):
        ids = torch.cat([prefix, _ids(n, seed)])
        ref_logits, ref_cache, hit = eager.prefill(ids)
        logits, cache, hit_g = graphed.prefill(ids)
        assert hit == hit_g == 2 * BLOCK and cache.seen_tokens == ref_cache.seen_tokens == len(ids)
        assert logits.shape == ref_logits.shape == (1, 1, VOCAB)
        assert not logits.requires_grad  # run without autograd, as the eager prefill (else no kernels)
        assert rel_err(logits, ref_logits) < 1e-5
        _assert_same_states(cache, ref_cache)
        assert bool(cache.conv) == conv
        assert rel_err(_step(model, cache, 5), _step(model, ref_cache, 5)) < 1e-4
    assert sorted(k[0] for k in graphed.graphed_prefill.captures) == [64, 128]  # one capture per bucket


def test_a_short_miss_replays_too():
    """A prompt shorter than a block, not cached: no snapshot is due, so the pool replays its whole prefill from an
    empty cache (one capture of the fresh layout), with the eager pool's logits and states."""
    model = _model("int8_row", use_short_conv=True)
    eager, graphed = _pools(model, use_graph=False)
    ids = _ids(50, seed=3)
    ref_logits, ref_cache, hit = eager.prefill(ids)
    logits, cache, hit_g = graphed.prefill(ids)
    assert hit == hit_g == 0 and len(graphed) == len(eager) == 0
    assert [k[2] for k in graphed.graphed_prefill.captures] == ["fresh"]
    assert rel_err(logits, ref_logits) < 1e-5 and cache.seen_tokens == 50
    _assert_same_states(cache, ref_cache)


def test_what_stays_eager():
    model = _model()
    prefix = _ids(BLOCK)
    _, graphed = _pools(model, use_graph=False)
    graphed.prefill(torch.cat([prefix, _ids(3)]))  # a miss: eager, and it writes the snapshot
    graphed.prefill(torch.cat([prefix, _ids(BLOCK + 5, seed=2)]))  # a whole new block: eager, snapshot due
    graphed.prefill(torch.cat([prefix, _ids(1, seed=4)]))  # one new token: the decode kernel, eager
    assert not graphed.graphed_prefill.captures and len(graphed) == 2
    hybrid = _model(attn={"layers": [1], "num_heads": 2})  # softmax layers: their keys and values grow
    _, pool = _pools(hybrid, use_graph=False)
    pool.prefill(torch.cat([prefix, _ids(3)]))
    logits, _, hit = pool.prefill(torch.cat([prefix, _ids(9, seed=5)]))
    assert hit == BLOCK and not pool.graphed_prefill.captures and torch.isfinite(logits).all()
    assert model_graphable(model) and model_graphable(_model(use_short_conv=True)) and not model_graphable(hybrid)
    model.model.layers[1].attn.prefill_roundtrip = True  # rounds inside the prefill: the padding would too
    model.model.layers[1].attn.state_quantizer = StateQuantizer("int8_row")
    assert not model_graphable(model)


def test_a_failed_capture_falls_back_to_eager(monkeypatch):
    from laquant.serving import graphed_prefill

    def refuse(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphed_prefill._Capture, "__init__", refuse)
    model = _model("int8_row")
    prefix = _ids(BLOCK)
    eager, graphed = _pools(model, use_graph=False)
    for pool in (eager, graphed):
        pool.prefill(torch.cat([prefix, _ids(3, seed=9)]))
    ids = torch.cat([prefix, _ids(40, seed=2)])
    with pytest.warns(UserWarning, match="could not be captured"):
        logits, cache, hit = graphed.prefill(ids)
    ref_logits, ref_cache, _ = eager.prefill(ids)
    assert hit == BLOCK and torch.equal(logits, ref_logits)  # the same eager prefill
    assert all(torch.equal(a.data, b.data) for a, b in zip(cache.states, ref_cache.states))
    assert "not permitted" in graphed.graphed_prefill.failure and not graphed.graphed_prefill.captures
    restored = graphed.restore(graphed.lookup(ids))
    assert restored.states[0].n_stores == 0 and not graphed.graphed_prefill.covers(restored, 40)  # no second try


def test_an_out_of_memory_capture_refuses_its_bucket_only(monkeypatch):
    from laquant.generate import prefill_graphs
    from laquant.serving import graphed_prefill

    real = graphed_prefill._Capture

    def capture(model, layout, bucket, batch, use_graph, pool=None):
        if bucket == 256:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return real(model, layout, bucket, batch, use_graph, pool)

    monkeypatch.setattr(graphed_prefill, "_Capture", capture)
    model = _model()
    graphs = prefill_graphs(model)
    graphs.use_graph = False  # re-run eagerly on the static tensors: all but the capture
    graphs.pool = stale = object()  # a pool whose graphs are gone (a failed capture's): never captured into again
    with pytest.warns(UserWarning, match="out of memory.*1 x 256 tokens run eagerly"):
        assert graphs(model.new_cache(), _ids(200)[None]) is None
    assert graphs.failure is None and graphs(model.new_cache(), _ids(200)[None]) is None  # not tried again
    logits, _ = graphs(model.new_cache(), _ids(100)[None])  # a smaller bucket still replays
    with torch.no_grad():
        ref = model(_ids(100)[None], use_cache=True).logits[:, -1:]
    torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
    assert [k[0] for k in graphs.captures] == [128] and graphs.pool is not stale


@pytest.mark.parametrize("kind", ["gla", "gated_deltanet"])
def test_padded_replay_on_the_kernels(kind, monkeypatch):
    """The mixers' Triton path (the chunk kernels reading the masked keys and log-decays, the store
    kernel), under Triton's CPU interpreter: the padded replay against the eager resumed prefill."""
    if not INTERPRETED:
        pytest.skip("CPU tensors through the kernels need Triton's interpreter (on CUDA: the gpu test below)")
    require_triton_kernels()
    import laquant.models.recurrent as recurrent

    monkeypatch.setattr(recurrent, "use_triton", lambda x, fmt=None: True)
    model = _model("int8_row", kind)
    prefix = _ids(BLOCK)
    eager, graphed = _pools(model, use_graph=False)
    for pool in (eager, graphed):
        pool.prefill(torch.cat([prefix, _ids(3, seed=9)]))
    ids = torch.cat([prefix, _ids(45, seed=2)])
    ref_logits, ref_cache, _ = eager.prefill(ids)
    logits, cache, _ = graphed.prefill(ids)
    assert graphed.graphed_prefill.captures and rel_err(logits, ref_logits) < 1e-5
    for a, b in zip(cache.states, ref_cache.states):
        assert (a.data.int() - b.data.int()).abs().max() <= 1 and (a.data != b.data).float().mean() < 1e-3


@pytest.mark.parametrize("kind", ["gla", "gated_deltanet"])
def test_fresh_padded_replay_on_the_kernels(kind, monkeypatch):
    """A fresh prompt's padded prefill through the mixers' Triton path, under Triton's CPU interpreter."""
    if not INTERPRETED:
        pytest.skip("CPU tensors through the kernels need Triton's interpreter (on CUDA: the gpu test below)")
    require_triton_kernels()
    import laquant.models.recurrent as recurrent
    from laquant.models.cache import GLAStateCache
    from laquant.serving.graphed_prefill import GraphedPrefill

    monkeypatch.setattr(recurrent, "use_triton", lambda x, fmt=None: True)
    model = _model("int8_row", kind)
    ids = _ids(45, seed=2)[None]
    logits, cache = GraphedPrefill(model, 4096, use_graph=False)(GLAStateCache(3), ids)
    ref_logits, ref_cache = _eager_fresh(model, ids)
    assert rel_err(logits, ref_logits) < 1e-5
    _assert_same_states(cache, ref_cache)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "gla_int8_all"])
@torch.no_grad()
def test_gpu_graphed_fresh_prefill(recipe):
    """On CUDA, captured: a prompt of exactly a bucket's length runs the eager prefill's kernels on the same shapes
    (bit for bit), a shorter one is padded (close); generate's tokens with the graphed prefill equal the eager
    prefill's at a bucket's length; the graphs are reused per bucket and batch size and released."""
    import laquant
    from laquant.generate import generate, prefill, prefill_graphs, release_graphs
    from laquant.recipe import load_recipe

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GLAForCausalLM(GLAConfig(hidden_size=256, num_hidden_layers=3, num_heads=2, vocab_size=4096,
                                         use_short_conv=True))
    model = model.to(torch.bfloat16).eval()
    if recipe is not None:
        laquant.calibrate(model, load_recipe(recipe), torch.randint(0, 4096, (4, 256), device="cuda"), progress=False)
    for B, T in ((1, 128), (2, 128), (1, 100), (1, 128)):
        ids = torch.randint(0, 4096, (B, T), device="cuda")
        logits, cache = prefill(model, ids, graphed=True)
        ref_logits, ref_cache = prefill(model, ids)
        if T == 128:
            assert torch.equal(logits, ref_logits), (B, T)
            assert all(torch.equal(a.data, b.data) for a, b in zip(cache.states, ref_cache.states))
        else:
            assert rel_err(logits.float(), ref_logits.float()) < 2e-2
            for a, b in zip(cache.states, ref_cache.states):
                assert (a.data.float() - b.data.float()).abs().max() <= (1 if a.scale is not None else 2e-2)
    assert sorted(k[:2] for k in prefill_graphs(model).captures) == [(128, 1), (128, 2)]
    ids = torch.randint(0, 4096, (2, 128), device="cuda")
    assert torch.equal(generate(model, ids, 12, graphed_prefill=True), generate(model, ids, 12))
    release_graphs(model)
    assert "_laquant_prefill_graphs" not in model.__dict__


@pytest.mark.gpu
@pytest.mark.parametrize("state,kind", [(None, "gla"), ("int8_row", "gla"), ("int8_row", "gated_deltanet")])
def test_gpu_graph_replays_the_eager_resumed_prefill(state, kind):
    """On CUDA, captured: the replayed follow-up against the eager one (bf16 on the kernels), again
    for a second request in the same bucket, and the decode that continues it."""
    from laquant.serving.replay import greedy_decode

    model = _model(state, kind).cuda().to(torch.bfloat16)
    prefix = _ids(2 * BLOCK)
    eager, graphed = _pools(model, use_graph=True)
    for pool in (eager, graphed):
        pool.prefill(torch.cat([prefix, _ids(3, seed=9)]))
    for n, seed in ((100, 2), (70, 3), (100, 4)):
        ids = torch.cat([prefix, _ids(n, seed)])
        ref_logits, ref_cache, _ = eager.prefill(ids)
        logits, cache, _ = graphed.prefill(ids)
        assert rel_err(logits.float(), ref_logits.float()) < 1e-2
        for a, b in zip(cache.states, ref_cache.states):
            if state is None:
                torch.testing.assert_close(a.data, b.data, atol=2e-2, rtol=2e-2)
            else:
                assert (a.data.int() - b.data.int()).abs().max() <= 1
        # the caches continue alike (not bit for bit: the GEMMs ran at another M), also as a graphed decode
        assert rel_err(_step(model, cache, 5).float(), _step(model, ref_cache, 5).float()) < 2e-2
        assert greedy_decode(model, cache, logits[:, -1].argmax(-1), 4).shape == (1, 4)
    assert [k[0] for k in graphed.graphed_prefill.captures] == [128]


def test_eval_serve_reports_the_graphed_prefill(monkeypatch):
    """``eval serve``'s glue around the graphed pools (the third replay, the follow-up's graphed
    timing, the report), run on the CPU with the graphs re-run eagerly on their static tensors."""
    from laquant.eval.serve import markdown
    from laquant.serving import graphed_prefill, replay

    monkeypatch.setattr(graphed_prefill.GraphedPrefill.__init__, "__defaults__", (False,))  # use_graph=False
    monkeypatch.setattr(replay, "graphs_on_this_device", lambda model: True)
    model = _model("int8_row")
    workload = replay.Workload(system=BLOCK + 20, conversations=2, turns=2, user=9, reply=3)
    result = replay.serve_eval(model, workload, BLOCK, 1 << 30, ["fp32", "int8_row"], reps=2, progress=False)
    graphed, cached = result["prefix_cache_graphed"], result["prefix_cache"]
    assert graphed["requests"] == cached["requests"] == 4 and graphed["cached_tokens"] == cached["cached_tokens"] > 0
    f = result["follow_up"]
    assert f["graphed_cached_ttft_s"] > 0 and f["graphed_speedup"] > 0 and f["graphed_failure"] is None
    text = markdown({"device": "cpu", "dtype": "float32", "text": "-",
                     "results": [{"model": "tiny", "state_format": ["int8_row"], **result}]})
    assert "short hits' prefill as a CUDA graph" in text and "replayed as a CUDA graph" in text


def test_graphed_is_the_default_where_it_is_covered(monkeypatch):
    """``PrefixStateCache(graphed=None)`` replays short hits where the graphed prefill covers the model
    on its device (laquant's recurrent models on CUDA), and runs eagerly elsewhere or with ``graphed=False``."""
    from laquant.serving import graphed_prefill

    model = _model("int8_row")
    assert PrefixStateCache(model, BLOCK).graphed_prefill is None  # a CPU model
    monkeypatch.setattr(graphed_prefill, "graphs_on_this_device", lambda model: True)
    assert isinstance(PrefixStateCache(model, BLOCK).graphed_prefill, graphed_prefill.GraphedPrefill)
    assert PrefixStateCache(model, BLOCK, graphed=False).graphed_prefill is None
