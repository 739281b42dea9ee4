"""A cacheless forward replayed per batch size and token-count bucket (laquant.serving.graphed_forward): the padded
forward on static token ids against the eager forward (CPU: re-run eagerly on the same static tensors, the device
check patched; GPU: captured as a CUDA graph), what stays eager, and the callers that turn it on (eval ppl's prefill
mode, the lm-eval harness)."""

import pytest
import torch
import laquant
from laquant.eval.ppl import perplexity
from laquant.models import GLAConfig, GLAForCausalLM
from laquant.serving import graphed_forward
from laquant.serving.graphed_forward import GraphedForward, forward_graphable, forward_graphs, graphed_logits

VOCAB = 97


def _model(attn=False, device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    fields = dict(attn={"layers": [1], "num_heads": 2, "num_kv_heads": 1}) if attn else {}
    return GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=3, num_heads=2, vocab_size=VOCAB,
                                    **fields)).to(device, dtype).eval()


def _ids(batch, tokens, seed=1, device="cpu"):
    return torch.randint(0, VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(seed)).to(device)


def _eager(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture
def cpu_graphs(monkeypatch):
    """graphed_logits' device check passes on the CPU: its forwards re-run eagerly on the static tensors."""
    monkeypatch.setattr(graphed_forward, "_on_graph_device", lambda t: True)


@pytest.mark.parametrize("attn", [False, True])
def test_replay_equals_eager(attn):
    model = _model(attn)
    graphs = GraphedForward(model, use_graph=False)
    with torch.no_grad():
        at_bucket = graphs(_ids(2, 128))
        short = graphs(_ids(2, 100, seed=2))
    assert set(graphs.captures) and {k[:2] for k in graphs.captures} == {(2, 128)}  # 100 tokens pad to 128
    torch.testing.assert_close(at_bucket, _eager(model, _ids(2, 128)), rtol=0, atol=0)
    assert short.shape == (2, 100, VOCAB)
    torch.testing.assert_close(short, _eager(model, _ids(2, 100, seed=2)), rtol=1e-5, atol=1e-5)
    assert not torch.equal(at_bucket[:, :100], short)  # the second call's own tokens, not the first's


def test_exact_length_without_padding():
    model = _model()
    graphs = GraphedForward(model, use_graph=False)
    with torch.no_grad():
        out = graphs(_ids(1, 100), pad=False)
    assert [k[:2] for k in graphs.captures] == [(1, 100)]
    torch.testing.assert_close(out, _eager(model, _ids(1, 100)), rtol=0, atol=0)


def test_forward_routes_cacheless_calls(cpu_graphs, monkeypatch):
    model = _model()
    ids = _ids(1, 70)
    ref = _eager(model, ids)  # graphs off by default
    assert "_laquant_forward_graphs" not in model.__dict__
    model.laquant_graph_forward = True
    with torch.no_grad():
        out = model(ids)
        torch.testing.assert_close(out.logits, ref, rtol=1e-5, atol=1e-5)
        assert [k[:2] for k in forward_graphs(model).captures] == [(1, 128)]
        kept = model(ids, logits_to_keep=3).logits
        torch.testing.assert_close(kept, ref[:, -3:], rtol=1e-5, atol=1e-5)
        with_labels = model(ids, labels=ids)
        torch.testing.assert_close(with_labels.logits, ref, rtol=1e-5, atol=1e-5)
        eager_loss = torch.nn.functional.cross_entropy(ref[0, :-1].float(), ids[0, 1:])
        torch.testing.assert_close(with_labels.loss, eager_loss, rtol=1e-5, atol=1e-6)
        # calls that keep a cache run eagerly: their states are returned
        cached = model(ids, use_cache=True)
        assert cached.cache is not None and cached.cache.seen_tokens == 70
        assert len(forward_graphs(model).captures) == 1
    # with gradients (training, or a backward): eagerly
    out = model(ids)
    assert out.logits.requires_grad
    model.laquant_graph_forward = False
    assert graphed_logits(model, ids) is None
    monkeypatch.setenv("LAQUANT_GRAPH_FORWARD", "1")
    del model.laquant_graph_forward
    with torch.no_grad():
        assert graphed_logits(model, ids) is not None


def test_captures_are_evicted_least_recently_used():
    model = _model()
    graphs = GraphedForward(model, use_graph=False, max_captures=2)
    with torch.no_grad():
        for tokens in (64, 128, 64, 256):  # 64 used again before 256 comes: 128 goes
            graphs(_ids(1, tokens))
    assert [k[:2] for k in graphs.captures] == [(1, 64), (1, 256)]


def test_a_capture_out_of_memory_refuses_its_key_only(monkeypatch):
    model = _model()
    graphs = GraphedForward(model, use_graph=False)
    real = graphed_forward._Capture

    def capture(model, batch, tokens, use_graph, pool=None):
        if tokens == 256:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, batch, tokens, use_graph, pool)

    monkeypatch.setattr(graphed_forward, "_Capture", capture)
    with torch.no_grad():
        with pytest.warns(UserWarning, match="out of memory.*1 x 256 tokens run eagerly"):
            assert graphs(_ids(1, 200)) is None
        assert graphs(_ids(1, 200)) is None  # refused: no second try
        assert graphs(_ids(1, 100)) is not None and graphs.failure is None

        def refuse(*args, **kwargs):
            raise RuntimeError("operation not permitted when stream is capturing")

        monkeypatch.setattr(graphed_forward, "_Capture", refuse)
        with pytest.warns(UserWarning, match="not permitted.*its forwards run eagerly"):
            assert graphs(_ids(1, 1000)) is None
        assert "not permitted" in graphs.failure
        assert graphs(_ids(1, 100)) is None  # every later call, captured or not: eagerly


def test_what_is_not_covered(cpu_graphs):
    model = _model()
    model.laquant_graph_forward = True
    with torch.no_grad():
        assert graphed_logits(model, _ids(1, 5000)) is None  # over HOST_BOUND_TOKENS: bound by the GPU
        assert graphed_logits(model, _ids(2, 2100)) is None  # two sequences padded to 3,072 each
        assert graphed_logits(model, _ids(4, 1024)) is not None  # 4,096 in all
        assert graphed_logits(model, _ids(1, 8)[0]) is None  # 1-D
    model.train()
    with torch.no_grad():
        assert graphed_logits(model, _ids(1, 8)) is None
    model.eval()
    assert [k[:2] for k in forward_graphs(model).captures] == [(4, 1024)]


def test_a_pool_is_not_reused_once_its_graphs_are_gone():
    """PyTorch frees a graph pool with the last graph that used it; capturing into its handle again asserts."""
    model = _model()
    graphs = GraphedForward(model, use_graph=False)
    graphs.pool = stale = object()
    with torch.no_grad():
        graphs(_ids(1, 64))  # no capture left: a fresh pool (none here, without CUDA graphs)
    assert graphs.pool is not stale
    graphs.pool = kept = object()
    with torch.no_grad():
        graphs(_ids(1, 128))  # a capture still uses it: shared
    assert graphs.pool is kept


def test_a_hooked_model_runs_eagerly(cpu_graphs):
    """Calibration observes through forward hooks; a replay would skip them."""
    model = _model()
    model.laquant_graph_forward = True
    seen = []
    handle = model.model.layers[1].mlp.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    with torch.no_grad():
        model(_ids(1, 64))
        model(_ids(1, 64))
    assert len(seen) == 2 and not forward_graphs(model).captures
    handle.remove()
    with torch.no_grad():
        model(_ids(1, 64))
    assert forward_graphs(model).captures


def _hybrid(family, **kw):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_static_hybrid import _installed

    return _installed(family, **kw).eval()


TEXT_HYBRIDS = ["qwen3_next", "minimax", "bamba", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "nemotron_h", "kimi_linear",
                "bailing_hybrid", "granitemoehybrid", "falcon_h1", "zamba2", "mamba2"]


@pytest.mark.parametrize("family", TEXT_HYBRIDS)
def test_a_hybrid_replays_its_cacheless_calls(family, cpu_graphs):
    """A transformers hybrid with laquant's mixers: lm-eval's call (ids only) replays; calls with anything else
    (a cache, use_cache, a mask) run transformers' forward as before."""
    model = _hybrid(family)
    ids = torch.randint(1, 100, (1, 70), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
        model.laquant_graph_forward = True
        assert forward_graphable(model)
        out = model(ids)
        assert out.past_key_values is None
        torch.testing.assert_close(out.logits, ref, rtol=1e-5, atol=1e-5)
        assert [k[:2] for k in forward_graphs(model).captures] == [(1, 128)]
        assert model(input_ids=ids, use_cache=True).past_key_values is not None  # eagerly, with its cache
        masked = model(ids, attention_mask=torch.ones_like(ids))
        torch.testing.assert_close(masked.logits, ref, rtol=1e-5, atol=1e-5)
        assert len(forward_graphs(model).captures) == 1


def test_a_hybrid_capture_that_differs_from_eager_turns_graphs_off(cpu_graphs, monkeypatch):
    """A hybrid's new capture is checked against its eager forward on the same tokens: a replay that differs (here
    made to) turns the model's graphs off with a warning, and the call gets the eager logits."""
    model = _hybrid("qwen3_next")
    run = graphed_forward._Capture._run
    monkeypatch.setattr(graphed_forward._Capture, "_run", lambda self: run(self) + 1e-3)
    ids = _ids(1, 70)
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
        model.laquant_graph_forward = True
        with pytest.warns(UserWarning, match="does not replay as a CUDA graph"):
            out = model(ids)
        assert out.past_key_values is not None  # transformers' own forward
        torch.testing.assert_close(out.logits, ref, rtol=0, atol=0)
        assert forward_graphs(model).failure and not forward_graphs(model).captures
        assert model(ids).past_key_values is not None  # and eagerly from then on


def test_a_hybrid_capture_whose_check_runs_out_of_memory_refuses_its_shape(cpu_graphs, monkeypatch):
    model = _hybrid("qwen3_next")
    logits = graphed_forward.cacheless_logits
    calls = []

    def check_out_of_memory(model, ids):
        calls.append(ids.shape)
        if len(calls) == 2:  # the check's eager forward, after the replay's
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return logits(model, ids)

    monkeypatch.setattr(graphed_forward, "cacheless_logits", check_out_of_memory)
    with torch.no_grad():
        ref = model(_ids(1, 70), use_cache=False).logits
        model.laquant_graph_forward = True
        with pytest.warns(UserWarning, match="could not be checked"):
            out = model(_ids(1, 70)).logits
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        graphs = forward_graphs(model)
        assert graphs.failure is None and not graphs.captures and [k[:2] for k in graphs.refused] == [(1, 128)]
        model(_ids(1, 300))  # another bucket still captures
        assert [k[:2] for k in graphs.captures] == [(1, 512)]


def test_a_hybrid_capture_builds_the_eager_mask(monkeypatch):
    """While a stream captures, transformers' mask builders take it for tracing (is_tracing) and build an explicit
    mask where the eager call lets SDPA run is_causal; a capture builds the eager masks. Here the capture is
    simulated (is_tracing true) and the softmax layer's mask recorded."""
    from transformers import masking_utils
    from transformers.models.qwen3_next import modeling_qwen3_next

    model = _hybrid("qwen3_next")
    masks = []
    build = modeling_qwen3_next.create_causal_mask
    monkeypatch.setattr(modeling_qwen3_next, "create_causal_mask", lambda *a, **kw: masks.append(build(*a, **kw))
                        or masks[-1])
    monkeypatch.setattr(masking_utils, "is_tracing", lambda *a: True)
    checks = masking_utils.find_packed_sequence_indices, masking_utils.is_tracing
    with torch.no_grad():
        model(_ids(1, 64), use_cache=False)  # transformers' own forward, as if captured: an explicit mask
        graphed_forward.cacheless_logits(model, _ids(1, 64))
    assert masks[0] is not None and masks[1] is None
    assert (masking_utils.find_packed_sequence_indices, masking_utils.is_tracing) == checks


def test_ppl_prefill_replays_a_hybrids_batches(cpu_graphs):
    model = _hybrid("qwen3_next")
    ids = torch.randint(1, 8000, (700,), generator=torch.Generator().manual_seed(5))
    eager = perplexity(model, ids, context=64, stride=32, batch_size=2, progress=False, graphed=False)
    graphed = perplexity(model, ids, context=64, stride=32, batch_size=2, progress=False)
    assert not eager.graphed and graphed.graphed
    assert [k[:2] for k in forward_graphs(model).captures] == [(2, 64)]
    assert graphed.nll == eager.nll and graphed.loss_by_position == eager.loss_by_position


def test_per_tensor_activation_scales_are_not_covered():
    model = _model()
    laquant.calibrate(model, "gla_w8a8_naive", torch.randint(0, VOCAB, (2, 64)), progress=False)
    assert not forward_graphable(model)
    assert GraphedForward(model, use_graph=False)(_ids(1, 64)) is None
    quantized = _model()
    laquant.calibrate(quantized, "gla_int8_all", torch.randint(0, VOCAB, (2, 64)), progress=False)
    assert forward_graphable(quantized)


def test_moving_the_model_releases_its_forward_graphs(cpu_graphs):
    model = _model()
    model.laquant_graph_forward = True
    with torch.no_grad():
        model(_ids(1, 64))
    assert forward_graphs(model).captures
    model.to(torch.float64)
    assert "_laquant_forward_graphs" not in model.__dict__


def test_ppl_prefill_replays_its_batches(cpu_graphs):
    model = _model()
    ids = _ids(1, 700)[0]
    eager = perplexity(model, ids, context=64, stride=32, batch_size=2, progress=False, graphed=False)
    graphed = perplexity(model, ids, context=64, stride=32, batch_size=2, progress=False)
    assert not eager.graphed and graphed.graphed
    # 21 windows in batches of two: one capture of the windows' exact length, the same numbers as eagerly
    assert [k[:2] for k in forward_graphs(model).captures] == [(2, 64)]
    assert graphed.nll == eager.nll and graphed.loss_by_position == eager.loss_by_position
    few = perplexity(_model(), ids[:150], context=64, stride=32, batch_size=2, progress=False)
    assert not few.graphed  # four windows, two batches: not worth a capture
    long_ids = _ids(1, 2600)[0]  # 66 windows of 512: seven batches of nine, 4,608 tokens each
    large = perplexity(_model(), long_ids, context=512, stride=32, batch_size=9, progress=False)
    assert not large.graphed  # bound by the GPU, not the host
    assert perplexity(_model(), long_ids, context=512, stride=32, batch_size=8, progress=False).graphed


@pytest.mark.gpu
@pytest.mark.parametrize("family", TEXT_HYBRIDS)
def test_gpu_hybrid_replay_equals_eager(family):
    model = _hybrid(family, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        for batch, tokens in ((1, 128), (2, 100)):
            ids = _ids(batch, tokens, seed=tokens, device="cuda")
            model.laquant_graph_forward = False
            ref = model(ids, use_cache=False).logits
            model.laquant_graph_forward = True
            out = model(ids).logits
            if tokens == 128:
                assert torch.equal(out, ref)
            else:
                torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    graphs = forward_graphs(model)
    assert graphs.failure is None and all(c.graph is not None for c in graphs.captures.values())


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "gla_int8_all"])
def test_gpu_replay_equals_eager(recipe):
    model = _model(attn=True, device="cuda", dtype=torch.bfloat16)
    if recipe is not None:
        laquant.calibrate(model, recipe, torch.randint(0, VOCAB, (2, 128), device="cuda"), progress=False)
    model.laquant_graph_forward = True
    with torch.no_grad():
        for batch, tokens in ((1, 128), (2, 256), (2, 200)):
            ids = _ids(batch, tokens, seed=tokens, device="cuda")
            out = model(ids).logits
            model.laquant_graph_forward = False
            ref = model(ids).logits
            model.laquant_graph_forward = True
            assert torch.isfinite(out).all()
            if tokens in (128, 256):  # a bucket's length: the eager kernels on the same shapes
                assert torch.equal(out, ref)
            else:
                torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    graphs = forward_graphs(model)
    assert graphs.failure is None and all(c.graph is not None for c in graphs.captures.values())
    graphs.captures.clear()  # their pool goes with them: the next capture takes a new one
    with torch.no_grad():
        ids = _ids(1, 128, seed=5, device="cuda")
        out = model(ids).logits
        model.laquant_graph_forward = False
        assert torch.equal(out, model(ids).logits)
    assert graphs.failure is None and len(graphs.captures) == 1
