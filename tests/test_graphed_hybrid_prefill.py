"""A transformers hybrid's fresh prefill replayed per token-count bucket (laquant.serving.graphed_hybrid_prefill): the
prompt padded on the left and masked, its padding's keys dropped from the cache, against the eager prefill of the
prompt alone (CPU: re-run eagerly on the same static tensors; GPU: captured as a CUDA graph), and what stays eager."""

import pytest
import torch
from conftest import rel_err
from test_hybrid import FAMILIES

from laquant.adapters import cache_kwargs, install, new_cache, returned_cache
from laquant.models.cache import state_store
from laquant.models.static_hybrid import kv_layers
from laquant.serving.graphed_hybrid_prefill import HybridPrefillGraphs, hybrid_prefill_graphable


# how far a quantized model's padded prefill may be from the prompt's own: the summation order (~1e-7 apart) tips an
# int8 activation code over now and then, which moves what follows by ~1e-4 (CPU, 100 tokens: qwen3_next's logits
# 2.5e-4, MiniMax's keys 4.2e-4 and a state's scales 1.4e-4; on the H100 MiniMax's scales 8e-5). Padding left unmasked
# moves the logits by 9e-3 and more (misplaced positions show in the keys alone, below).
QUANTIZED_TOL = 1e-3
# The cached keys and values: a tipped code moves its token's key and, through the layers' states, the keys of tokens
# after it in that sequence by up to ~1e-2 (the H100, MiniMax, B = 2, T = 100: a tensor 1.2e-3 apart as a whole, 28
# of its 200 token rows 1e-4 to 7e-3, one run in three). Planted bugs (CPU, the 5 quantized families): padding left
# unmasked 0.016-0.13 (Kimi Linear's keys don't move, its logits do: 0.009-0.022); positions shifted by one 0.24-0.29
# in the keys of the families whose attention takes positions, which leaves the logits alone.
QUANTIZED_KV_TOL = 5e-3


def _model(family, recipe=None, device="cpu", dtype=torch.float32, **overrides):
    torch.manual_seed(3)
    model = FAMILIES[family](**overrides).to(device, dtype).eval()
    install(model)
    if recipe is not None:
        from laquant.api import calibrate
        from laquant.recipe import load_recipe

        data = torch.randint(1, 500, (2, 64), generator=torch.Generator().manual_seed(0)).to(device)
        model = calibrate(model, load_recipe(recipe), data=data, progress=False).model
    return model


@torch.no_grad()
def _eager(model, ids):
    cache = new_cache(model)
    out = model(input_ids=ids, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
    return out.logits, returned_cache(out)


@torch.no_grad()
def _step(model, cache, tok):
    return model(input_ids=tok, **cache_kwargs(model, cache), use_cache=True).logits[:, -1]


def _assert_same_cache(cache, ref, tokens: int, quantized: bool):
    store, ref_store = state_store(cache), state_store(ref)
    assert store.seen_tokens == ref_store.seen_tokens == tokens
    assert sorted(store.states) == sorted(ref_store.states) and store.states
    for i, s in store.states.items():
        r = ref_store.states[i]
        assert s.format == r.format and s.data.shape == r.data.shape and torch.isfinite(s.data.float()).all()
        if s.scale is None:
            assert rel_err(s.data.float(), r.data.float()) < 1e-5, i
        else:  # stochastic codes of float32 states equal up to summation order: a code apart at most, and rarely
            assert (s.data.int() - r.data.int()).abs().max() <= 1 and (s.data != r.data).float().mean() < 1e-2
            assert rel_err(s.scale, r.scale) < QUANTIZED_TOL
    assert sorted(store.conv) == sorted(ref_store.conv)
    for i, t in store.conv.items():
        assert t.shape == ref_store.conv[i].shape and rel_err(t, ref_store.conv[i]) < 1e-5
    kv, ref_kv = kv_layers(cache), kv_layers(ref)
    assert sorted(kv) == sorted(ref_kv)
    for i, (k, v) in kv.items():
        assert k.shape == ref_kv[i][0].shape and k.shape[-2] == tokens and k.is_contiguous()
        tol = QUANTIZED_KV_TOL if quantized else 1e-5
        assert rel_err(k, ref_kv[i][0]) < tol and rel_err(v, ref_kv[i][1]) < max(tol, 1e-4), i


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_prefill_equals_the_prompt_alone(family):
    """Every family: the logits, states, conv inputs and keys of a prompt padded on the left to its bucket equal the
    prompt's eager prefill, and its cache decodes as that one does; batches of 1 and 2, a prompt of a bucket's length
    (no padding), a shorter one after it in the same static tensors."""
    model = _model(family)
    graphs = HybridPrefillGraphs(model, 4096, use_graph=False)
    for B, T, seed in ((2, 37, 1), (1, 64, 2), (1, 5, 3), (1, 70, 4)):
        ids = torch.randint(1, 500, (B, T), generator=torch.Generator().manual_seed(seed))
        fresh = new_cache(model)
        logits, cache = graphs(fresh, ids)
        ref_logits, ref_cache = _eager(model, ids)
        assert logits.shape == ref_logits.shape and logits.shape[:2] == (B, 1)
        assert rel_err(logits, ref_logits) < 1e-5, (B, T)
        _assert_same_cache(cache, ref_cache, T, quantized=False)
        tok = torch.randint(1, 500, (B, 1), generator=torch.Generator().manual_seed(seed + 10))
        assert rel_err(_step(model, cache, tok), _step(model, ref_cache, tok)) < 1e-5
        assert not state_store(fresh).states  # the empty cache stays empty
    assert sorted(k[:2] for k in graphs.captures) == [(1, 64), (1, 128), (2, 64)]  # batch, bucket


@pytest.mark.parametrize("family", ["qwen3_next", "minimax", "kimi_linear", "granitemoehybrid", "zamba2"])
@torch.no_grad()
def test_prompts_of_several_lengths(family):
    """Prompts padded on the left with their mask (laquant.generate's ``attention_mask``): the replay's cache is the
    eager padded prefill's (their own padding kept, the bucket's dropped), and each sequence then decodes as alone."""
    from laquant.generate import _padding_kwargs

    model = _model(family)
    ids = torch.randint(1, 500, (3, 21), generator=torch.Generator().manual_seed(8))
    padding = torch.ones_like(ids, dtype=torch.bool)
    padding[0, :6], padding[2, :1] = False, False
    ids = ids.masked_fill(~padding, 0)
    logits, cache = HybridPrefillGraphs(model, 4096, use_graph=False)(new_cache(model), ids, padding)
    ref_cache = new_cache(model)
    ref = model(input_ids=ids, **cache_kwargs(model, ref_cache), use_cache=True, logits_to_keep=1,
                **_padding_kwargs(model, padding))
    assert rel_err(logits, ref.logits) < 1e-5
    _assert_same_cache(cache, returned_cache(ref), 21, quantized=False)
    alone = _eager(model, ids[:1, 6:])[0]
    assert rel_err(logits[:1], alone) < 1e-5


@pytest.mark.parametrize("family", ["qwen3_next", "minimax"])
def test_generate_with_the_graphed_prefill(family, monkeypatch):
    """laquant.generate with ``graphed_prefill`` on a hybrid (its replays run eagerly on the static tensors here):
    the tokens of the eager prefill, prompts of one length and prompts padded on the left."""
    import laquant.generate as gen

    model = _model(family)
    graphs = model.__dict__["_laquant_prefill_graphs"] = HybridPrefillGraphs(model, 4096, use_graph=False)
    monkeypatch.setattr(gen, "graphed_prefill_refusal", lambda model, tokens: None)
    ids = torch.randint(1, 500, (2, 30), generator=torch.Generator().manual_seed(9))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    for kwargs in ({}, {"attention_mask": mask}):
        want = gen.generate(model, ids, 6, graphed=False, **kwargs)
        assert torch.equal(gen.generate(model, ids, 6, graphed=False, graphed_prefill=True, **kwargs), want)
    assert len(graphs.captures) == 1  # one bucket and batch size: the padded prompts replay the same capture


@pytest.mark.parametrize("family", ["qwen3_next", "minimax", "nemotron_h", "kimi_linear", "granitemoehybrid"])
@torch.no_grad()
def test_padded_prefill_of_a_quantized_hybrid(family):
    """``hybrid_int8`` (int8 projections and experts, int8 states rounded stochastically): the padded prefill's
    logits and states are the prompt's up to summation order and the int8 activation codes it tips over
    (:data:`QUANTIZED_TOL`), and the copy-out is the graph memory's, not a view."""
    model = _model(family, "hybrid_int8")
    graphs = HybridPrefillGraphs(model, 4096, use_graph=False)
    for T, seed in ((45, 5), (100, 2)):
        ids = torch.randint(1, 500, (2, T), generator=torch.Generator().manual_seed(seed))
        logits, cache = graphs(new_cache(model), ids)
        ref_logits, ref_cache = _eager(model, ids)
        assert rel_err(logits, ref_logits) < QUANTIZED_TOL
        _assert_same_cache(cache, ref_cache, T, quantized=True)
    capture = graphs.captures[next(k for k in graphs.captures if k[:2] == (2, 128))]
    kept = {i: s.data.clone() for i, s in state_store(cache).states.items()}
    capture.replay(torch.randint(1, 500, (2, 100), generator=torch.Generator().manual_seed(6)))
    assert all(torch.equal(state_store(cache).states[i].data, t) for i, t in kept.items())


def test_a_replay_that_differs_turns_the_graphs_off(monkeypatch):
    """The check of a new capture: a replay whose numbers differ from the same prefill run eagerly turns the model's
    graphed prefills off, warned, and they run eagerly from then on; a refused bucket's prefills run eagerly."""
    model = _model("qwen3_next")
    graphs = HybridPrefillGraphs(model, 4096, use_graph=False)
    ids = torch.randint(1, 500, (1, 20), generator=torch.Generator().manual_seed(7))
    graphs(new_cache(model), ids)
    (key, capture), = graphs.captures.items()
    logits, cache = capture.replay(ids)
    assert graphs._faithful(capture, logits.clone(), cache)
    with pytest.warns(UserWarning, match="does not replay as a CUDA graph .*differed.*run eagerly"):
        assert not graphs._faithful(capture, logits + 1e-3, cache)
    assert graphs.failure and not graphs.captures and graphs(new_cache(model), ids) is None

    graphs = HybridPrefillGraphs(model, 4096, use_graph=False)
    graphs.refused[key] = "out of memory"
    assert graphs(new_cache(model), ids) is None and graphs.failure is None
    assert graphs(new_cache(model), ids.repeat(2, 1)) is not None  # another batch size
    with pytest.raises(ValueError, match="empty cache"):
        graphs(cache, ids)
    assert HybridPrefillGraphs(model, 16, use_graph=False)(new_cache(model), ids) is None  # past max_tokens
    few = HybridPrefillGraphs(model, 4096, use_graph=False, max_captures=2)
    for batch in (1, 2, 1, 3):  # the least recently used capture is freed first
        few(new_cache(model), ids.repeat(batch, 1))
    assert [k[0] for k in few.captures] == [1, 3]


def test_a_capture_that_fails_runs_eagerly(monkeypatch):
    from laquant.serving import graphed_hybrid_prefill

    model = _model("nemotron_h")
    graphs = HybridPrefillGraphs(model, 4096, use_graph=False)

    def refuse(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphed_hybrid_prefill, "_Capture", refuse)
    with pytest.warns(UserWarning, match="could not be captured .*not permitted.*its prefills run eagerly"):
        assert graphs(new_cache(model), torch.ones(1, 9, dtype=torch.long)) is None
    assert graphs.failure


def test_what_a_graphed_hybrid_prefill_covers(monkeypatch):
    """Covered: an adapted hybrid (the refusal names the CUDA device first); not: forward hooks (calibration's
    observers), per-tensor activation scales, a model laquant did not adapt. generate's prefill picks the hybrid's
    graphs, and the masks' tracing switch is put back."""
    from transformers import masking_utils

    from laquant.generate import graphed_prefill_refusal, prefill_graphs

    model, quantized = _model("qwen3_next"), _model("qwen3_next", "hybrid_int8")
    assert hybrid_prefill_graphable(model)
    assert graphed_prefill_refusal(model, 20) == "CUDA graphs need a CUDA device"
    assert isinstance(prefill_graphs(model), HybridPrefillGraphs)
    before = masking_utils.is_tracing
    HybridPrefillGraphs(model, 4096, use_graph=False)(new_cache(model), torch.ones(1, 3, dtype=torch.long))
    assert masking_utils.is_tracing is before
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert graphed_prefill_refusal(model, 20) is None
    handle = model.model.layers[0].register_forward_hook(lambda *a: None)
    assert not hybrid_prefill_graphable(model) and "transformers hybrids" in graphed_prefill_refusal(model, 20)
    handle.remove()
    assert hybrid_prefill_graphable(quantized)
    next(m for m in quantized.modules() if type(m).__name__ == "QuantLinear").act_granularity = "per_tensor"
    assert not hybrid_prefill_graphable(quantized)
    torch.manual_seed(3)
    assert not hybrid_prefill_graphable(FAMILIES["qwen3_next"]().eval())  # not adapted
    assert hybrid_prefill_graphable(_model("minimax"))


# (family, recipe, config overrides, captures): transformers' float32 experts (grouped_mm) copy from the host, which a
# capture refuses: that model's prefills run eagerly, as its decode steps do (tests/test_static_hybrid.py's GPU_CASES)
GPU_PREFILL_CASES = [("qwen3_next", None, {"num_experts": 0}, True), ("qwen3_next", None, {}, False),
                     ("qwen3_next", "hybrid_int8", {}, True), ("nemotron_h", "hybrid_int8", {}, True),
                     ("kimi_linear", "hybrid_int8", {}, True), ("granitemoehybrid", "hybrid_int8", {}, True),
                     ("minimax", "hybrid_int8", {}, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("family,recipe,overrides,captures", GPU_PREFILL_CASES)
@torch.no_grad()
def test_gpu_graphed_hybrid_prefill(family, recipe, overrides, captures):
    """On CUDA, captured: no failure (the capture replays its eager run bit for bit, checked at capture), the prompt's
    logits and states close to its eager prefill's, and generate's greedy tokens after it those of the eager prefill
    (float32: no near-ties), prompts of several lengths too; the graphs are kept per bucket and batch size and
    released. A model whose capture is refused gives the eager prefill's results."""
    _check_graphed_prefill(_model(family, recipe, device="cuda", **overrides), recipe is not None, captures)


def _check_graphed_prefill(model, quantized: bool, captures: bool):
    from laquant.generate import generate, prefill, prefill_graphs, release_graphs

    for B, T in ((1, 128), (2, 100), (1, 100)):
        ids = torch.randint(1, 500, (B, T), device="cuda")
        logits, cache = prefill(model, ids, graphed=True)
        assert (prefill_graphs(model).failure is None) == captures, prefill_graphs(model).failure
        ref_logits, ref_cache = prefill(model, ids)
        assert rel_err(logits, ref_logits) < (QUANTIZED_TOL if quantized else 1e-4), (B, T)
        _assert_same_cache(cache, ref_cache, T, quantized=quantized)
    assert sorted(k[:2] for k in prefill_graphs(model).captures) == ([(1, 128), (2, 128)] if captures else [])
    ids = torch.randint(1, 500, (2, 90), device="cuda")
    assert torch.equal(generate(model, ids, 12, graphed_prefill=True), generate(model, ids, 12))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0  # prompts of several lengths
    assert torch.equal(generate(model, ids, 12, graphed_prefill=True, attention_mask=mask),
                       generate(model, ids, 12, attention_mask=mask))
    for m in (torch.ones_like(ids), mask):  # transformers' generate, its prefill replayed where switched on
        want = model.generate(ids, attention_mask=m, max_new_tokens=8, do_sample=False)
        model.laquant_graph_prefill = True
        got = model.generate(ids, attention_mask=m, max_new_tokens=8, do_sample=False)
        model.laquant_graph_prefill = False
        assert torch.equal(got, want)
    assert (prefill_graphs(model).failure is None) == captures
    release_graphs(model)
    assert "_laquant_prefill_graphs" not in model.__dict__


def _hf_graphs_on_the_cpu(model, monkeypatch) -> HybridPrefillGraphs:
    """transformers' generate through the hybrid's graphed prefill, its replays run eagerly on the static tensors."""
    import laquant.generate as gen
    from laquant.serving import graphed_forward

    graphs = model.__dict__["_laquant_prefill_graphs"] = HybridPrefillGraphs(model, 4096, use_graph=False)
    monkeypatch.setattr(gen, "graphed_prefill_refusal", lambda model, tokens: None)
    monkeypatch.setattr(graphed_forward, "_on_graph_device", lambda t: True)
    return graphs


@pytest.mark.parametrize("family", ["qwen3_next", "minimax", "nemotron_h", "falcon_h1"])
@torch.no_grad()
def test_transformers_generate_replays_its_prefill(family, monkeypatch):
    """``model.laquant_graph_prefill = True``: transformers' generate takes the replayed prefill (prompts of one length,
    left-padded ones), the same tokens as without it; the caller's own cache object is the one filled; off by
    default."""
    model = _model(family)
    graphs = _hf_graphs_on_the_cpu(model, monkeypatch)
    ids = torch.randint(1, 500, (2, 12), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    want = {k: model.generate(ids, attention_mask=m, max_new_tokens=5, do_sample=False) for k, m in
            (("one length", torch.ones_like(ids)), ("padded", mask))}
    assert not graphs.captures  # off by default
    model.laquant_graph_prefill = True
    replays = []
    call = HybridPrefillGraphs.__call__
    monkeypatch.setattr(HybridPrefillGraphs, "__call__", lambda self, *a: replays.append(a[-1]) or call(self, *a))
    for k, m in (("one length", torch.ones_like(ids)), ("padded", mask)):
        assert torch.equal(model.generate(ids, attention_mask=m, max_new_tokens=5, do_sample=False), want[k]), k
    assert len(graphs.captures) == 1 and replays[0] is None and torch.equal(replays[1], mask.bool())
    own = new_cache(model)  # a cache the caller passes: filled in place, as the eager prefill fills it
    ref = new_cache(model)
    model.generate(ids, **cache_kwargs(model, own), max_new_tokens=1, do_sample=False)
    model.laquant_graph_prefill = False
    model.generate(ids, **cache_kwargs(model, ref), max_new_tokens=1, do_sample=False)
    _assert_same_cache(own, ref, 12, quantized=False)


def test_what_transformers_generate_prefills_eagerly(monkeypatch):
    """The prefill calls that stay eager with graphed prefills on: more than the last position's logits, right
    padding, positions of their own, a cache that holds tokens already."""
    from laquant.serving.graphed_hybrid_prefill import hybrid_generate_prefill

    model = _model("qwen3_next")
    _hf_graphs_on_the_cpu(model, monkeypatch)
    model.laquant_graph_prefill = True
    ids = torch.randint(1, 500, (2, 12), generator=torch.Generator().manual_seed(12))

    def call(**kwargs):
        base = dict(input_ids=ids, cache=new_cache(model), logits_to_keep=1, use_cache=True)
        with torch.no_grad():
            return hybrid_generate_prefill(model, (), {**base, **kwargs})

    assert call() is not None
    assert call(logits_to_keep=0) is None
    right = torch.ones_like(ids)
    right[0, -3:] = 0
    assert call(attention_mask=right) is None
    assert call(position_ids=torch.arange(1, 13).expand(2, 12)) is None
    assert call(position_ids=torch.arange(12).expand(2, 12)) is not None
    left = torch.ones_like(ids)
    left[0, :4] = 0
    counted = (left.cumsum(-1) - 1).clamp(min=0)  # transformers 5.25's: 0 at the padding
    assert call(attention_mask=left, position_ids=counted) is not None
    assert call(attention_mask=left, position_ids=torch.arange(12).expand(2, 12)) is None
    full = new_cache(model)
    with torch.no_grad():
        model(input_ids=ids[:, :3], **cache_kwargs(model, full), use_cache=True)
    assert call(cache=full) is None
    assert call(output_hidden_states=True) is None


@pytest.mark.parametrize("family", ["qwen3_next", "nemotron_h"])
def test_padded_prefill_through_the_prompt_kernels(family, monkeypatch):
    """The short convs and the gated attention on their prompt kernels (interpreted; the other kernels keep their
    references): the prompt padded on the left to its bucket gives the unpadded prefill's logits and cache."""
    from conftest import INTERPRETED, require_triton_kernels

    require_triton_kernels()
    if not INTERPRETED:
        pytest.skip("the CPU's interpreted kernels")
    from laquant.kernels.attention import qk_norm_rope
    from laquant.kernels.conv import short_conv as module
    from laquant.models import gated_attention, hybrid_mixers

    calls, attention = [], []
    real, real_attention = module.short_conv_triton, qk_norm_rope.qk_norm_rope_triton
    monkeypatch.setattr(module, "short_conv_triton", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(qk_norm_rope, "qk_norm_rope_triton",
                        lambda *a, **k: attention.append(1) or real_attention(*a, **k))
    monkeypatch.setattr(hybrid_mixers, "use_triton", lambda x, state_format=None: state_format is None)
    monkeypatch.setattr(gated_attention, "use_triton", lambda x, state_format=None: True)
    model = _model(family)
    ids = torch.randint(1, 500, (2, 23), generator=torch.Generator().manual_seed(13))
    logits, cache = HybridPrefillGraphs(model, 4096, use_graph=False)(new_cache(model), ids)
    ref_logits, ref_cache = _eager(model, ids)
    assert calls and bool(attention) == (family == "qwen3_next") and rel_err(logits, ref_logits) < 1e-5
    _assert_same_cache(cache, ref_cache, 23, quantized=False)
