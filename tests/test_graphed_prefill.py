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
        for a, b in zip(cache.states, ref_cache.states):
            assert a.format == b.format and a.n_stores == b.n_stores == 1
            if state is None:
                torch.testing.assert_close(a.data, b.data, atol=1e-5, rtol=1e-5)
            else:  # the same stochastic store of float32 states equal up to summation order
                torch.testing.assert_close(a.scale, b.scale, atol=0, rtol=1e-5)
                assert (a.data.int() - b.data.int()).abs().max() <= 1
                assert (a.data != b.data).float().mean() < 1e-3
        assert cache.conv.keys() == ref_cache.conv.keys() and bool(cache.conv) == conv
        for key, t in cache.conv.items():
            torch.testing.assert_close(t, ref_cache.conv[key], atol=1e-6, rtol=1e-5)
        assert rel_err(_step(model, cache, 5), _step(model, ref_cache, 5)) < 1e-4
    assert sorted(k[0] for k in graphed.graphed_prefill.captures) == [64, 128]  # one capture per bucket


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
