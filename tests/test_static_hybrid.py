"""The static cache of a transformers hybrid's decode step (laquant.models.static_hybrid), which the
CUDA-graphed loops of laquant.generate and ``eval ppl --mode decode`` replay: on the CPU its steps
run eagerly and must give the dynamic cache's logits for every family that takes it; on a GPU the
captured loops must give the eager loops' tokens and losses."""

import pytest
import torch
from test_hybrid import FAMILIES, VOCAB, _model

from laquant.adapters import cache_kwargs, install, new_cache
from laquant.errors import LaquantError
from laquant.generate import generate, is_graphable, static_cache, static_forward
from laquant.models.cache import HybridStates, state_store
from laquant.models.quantizing_rowwise import original_class
from laquant.models.static_hybrid import StaticHybridCache


def _installed(family, dtype=torch.float32, device="cpu"):
    model = _model(family).to(device, dtype)
    install(model)
    return model


def _prefilled(model, ids):
    cache = new_cache(model)
    model(input_ids=ids, **cache_kwargs(model, cache), use_cache=True)
    return cache


def transformers_forward(model, class_names):
    """Give the model's modules whose class is named in ``class_names`` back transformers' own forward
    (undo laquant's mixin)."""
    for m in model.modules():
        if original_class(m).__name__ in class_names:
            m.__class__ = original_class(m)


def _falcon_gated_norm_broadcasts() -> bool:
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1RMSNormGated

    x = torch.randn(2, 1, 8)
    return FalconH1RMSNormGated(8)(x, torch.randn(2, 1, 8)).shape != x.shape


@pytest.mark.parametrize("family", list(FAMILIES))
@torch.no_grad()
def test_static_steps_equal_the_dynamic_caches(family):
    """Six decode steps on the static cache (states and conv inputs in place, keys written at the
    device-side position, the mask and positions following it) against the dynamic cache's."""
    if family == "falcon_h1" and _falcon_gated_norm_broadcasts():
        pytest.skip("this transformers' FalconH1RMSNormGated turns a batch of one-token rows [B, 1, C] into "
                    "[B, B, C] (its decode is wrong at B > 1, eagerly too)")
    model = _installed(family)
    gen = torch.Generator().manual_seed(0)
    ids, steps = torch.randint(0, VOCAB, (2, 11), generator=gen), torch.randint(0, VOCAB, (2, 6), generator=gen)
    dynamic = _prefilled(model, ids)
    static = static_cache(_prefilled(model, ids), 11 + 8)
    assert isinstance(static, StaticHybridCache) and static.capacity == 19
    assert bool(static.kv) == (family != "mamba2")  # Mamba2 language models have no softmax attention
    states = dict(static.laquant_states.states)
    convs = {i: t.data_ptr() for i, t in static.laquant_states.conv.items()}
    for t in range(steps.shape[1]):
        want = model(input_ids=steps[:, t:t + 1], **cache_kwargs(model, dynamic), use_cache=True).logits[:, -1]
        got = static_forward(model, steps[:, t:t + 1], static)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert int(static.pos) == 17 and {i: t.data_ptr() for i, t in static.laquant_states.conv.items()} == convs
    assert static.laquant_states.states.keys() == states.keys()  # (replaced on the reference ops, in place on kernels)
    for i, (k, v) in static.kv.items():  # the keys written at their positions, the rest untouched
        dk = dynamic.layers[i].keys
        torch.testing.assert_close(k[..., :17, :], dk)
        assert not k[..., 17:, :].any() and not v[..., 17:, :].any()


@torch.no_grad()
def test_the_mask_and_the_positions_matter():
    """The same steps without opening the step's position in the mask, or at a wrong position, differ:
    the test above would see a static cache that ignored either."""
    model = _installed("qwen3_next")
    ids, tok = torch.randint(0, VOCAB, (1, 9)), torch.randint(0, VOCAB, (1, 1))
    want = model(input_ids=tok, past_key_values=_prefilled(model, ids), use_cache=True).logits[:, -1]
    closed = static_cache(_prefilled(model, ids), 16)
    closed.begin_step()
    closed.mask.fill_(torch.finfo(closed.mask.dtype).min)
    closed.mask[..., :9] = 0  # position 9 (this token) left closed
    out = model(input_ids=tok, past_key_values=closed, use_cache=True, position_ids=closed.pos.view(1, 1),
                attention_mask=closed.mask).logits[:, -1]
    assert (out - want).abs().max() > 1e-3
    shifted = static_cache(_prefilled(model, ids), 16)
    shifted.pos.fill_(10)  # the token written one position late, with a rotary position one too far
    shifted.mask[..., 9] = 0
    assert (static_forward(model, tok, shifted) - want).abs().max() > 1e-3


def test_static_decode_attention_is_eager_attention_without_repeated_keys():
    """Against transformers' eager attention (keys repeated per query head) on random GQA inputs with
    an additive mask, one and three query tokens; MLA's wider keys than values too."""
    from transformers.models.qwen3_next.modeling_qwen3_next import eager_attention_forward

    from laquant.models.static_hybrid import static_decode_attention

    gen = torch.Generator().manual_seed(0)
    for T, Dk, Dv in ((1, 32, 32), (3, 24, 24), (1, 48, 32)):
        q, k = torch.randn(2, 6, T, Dk, generator=gen), torch.randn(2, 2, 19, Dk, generator=gen)
        v = torch.randn(2, 2, 19, Dv, generator=gen)
        mask = torch.where(torch.rand(2, 1, T, 19, generator=gen) < 0.3, torch.finfo(torch.float32).min, 0.0)
        module = torch.nn.Module()
        module.num_key_value_groups, module.training = 3, False
        want, _ = eager_attention_forward(module, q, k, v, mask, scaling=0.7)
        got, _ = static_decode_attention(module, q, k, v, mask, scaling=0.7)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert (got - static_decode_attention(module, q, k, v, None, scaling=0.7)[0]).abs().max() > 1e-3


@torch.no_grad()
def test_static_steps_run_the_grouped_attention(monkeypatch):
    """A static step runs laquant's attention on every softmax layer; the configs read their own
    implementation again after it."""
    import laquant.models.static_hybrid as sh

    model = _installed("qwen3_next")
    calls = []
    wrapped = sh.static_decode_attention
    monkeypatch.setitem(sh.ALL_ATTENTION_FUNCTIONS._global_mapping, sh.ATTENTION,
                        lambda *a, **kw: calls.append(1) or wrapped(*a, **kw))
    before = model.config._attn_implementation
    static = static_cache(_prefilled(model, torch.randint(0, VOCAB, (1, 5))), 8)
    static_forward(model, torch.randint(0, VOCAB, (1, 1)), static)
    assert len(calls) == len(static.kv) == 1 and model.config._attn_implementation == before != sh.ATTENTION


def test_static_hybrid_states_count_on_the_device():
    from laquant.kernels.common.state import State

    store = HybridStates(seed=3)
    for layer in (0, 2, 5):
        store.states[layer] = State(torch.randn(2, 2, 4, 4), None, "fp32", 4)
        store.conv[layer] = torch.randn(2, 3, 8)
    store.seen_tokens = 7
    static = store.static_copy()
    slots = static.slots
    assert static.static and slots.last_layer == 5 and slots.n_stores.tolist() == [4, 4]
    assert all(s.slots is slots for s in static.states.values())
    for _ in range(3):
        for layer in (0, 2, 5):
            static.count_static_step(layer)
    assert static.sync_counters() == 3 and static.seen_tokens == 10
    assert [s.n_stores for s in static.states.values()] == [7, 7, 7]
    conv = static.conv[2]
    static.load_from(store)
    assert static.conv[2] is conv and torch.equal(conv, store.conv[2]) and slots.n_stores.tolist() == [4, 4]
    other = HybridStates(seed=3)
    other.states = {0: store.states[0]}
    with pytest.raises(ValueError, match="layers"):
        static.load_from(other)
    with pytest.raises(ValueError, match="run the prompt"):
        HybridStates().static_copy()


@torch.no_grad()
def test_laquant_calls_the_hybrids_with_transformers_cache_keyword():
    """laquant's own forwards with a cache (generate, eval ppl's decode, calibration, serving) pass it under
    the keyword the installed transformers takes: no deprecation warning from transformers 5.24 on (its
    ``past_key_values`` goes in 5.40)."""
    import inspect
    import warnings

    model = _installed("qwen3_next")
    takes_cache = "cache" in inspect.signature(type(model).forward).parameters
    assert list(cache_kwargs(model, None)) == ["cache" if takes_cache else "past_key_values"]
    ids = torch.randint(0, VOCAB, (1, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = generate(model, ids, 4, graphed=False)
    assert out.shape == (1, 10)


def test_a_model_that_insists_on_its_cache_class_gets_a_static_twin_of_it():
    """MiniMax's model takes no cache class but MiniMaxCache: a prefilled one (laquant's, or the plain one
    transformers' generate makes) becomes a static cache that is both a StaticHybridCache and a MiniMaxCache;
    any other hybrid's a plain StaticHybridCache."""
    from transformers import DynamicCache
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    from laquant.families import static_hybrid_class

    for cache in (new_cache(_installed("minimax")), MiniMaxCache()):
        cls = static_hybrid_class(cache)
        assert issubclass(cls, StaticHybridCache) and issubclass(cls, MiniMaxCache), type(cache)
    assert static_hybrid_class(DynamicCache()) is StaticHybridCache
    assert static_hybrid_class(new_cache(_installed("qwen3_next"))) is StaticHybridCache


@torch.no_grad()
def test_refusals():
    model = _installed("qwen3_next")
    cache = _prefilled(model, torch.randint(0, VOCAB, (1, 9)))
    with pytest.raises(ValueError, match="cannot continue"):
        StaticHybridCache.from_cache(cache, 9)
    cache.layers[3].keys = cache.layers[3].keys[..., 1:, :]  # a sliding window's keys: not every token's
    with pytest.raises(ValueError, match="sliding"):
        StaticHybridCache.from_cache(cache, 32)
    with pytest.raises(ValueError, match="run the prompt"):
        StaticHybridCache.from_cache(new_cache(model), 32)
    assert not is_graphable(model)  # the CPU
    with pytest.raises(LaquantError, match="on CUDA"):
        generate(model, torch.randint(0, VOCAB, (1, 4)), 3, graphed=True)


# ------------------------------------------------------------------------------------------- GPU
# (family, config overrides, must capture): transformers' fp32 MoE (grouped_mm) copies from the host,
# which a capture refuses; those fall back to the eager loop (falcon_h1 is left out: transformers 5.17's
# gated norm broadcasts a batch of one-token rows into the wrong shape, in the eager loop too)
GPU_CASES = [("qwen3_next", {"num_experts": 0}, True), ("bamba", {}, True), ("qwen3_next", {}, False),
             ("nemotron_h", {}, False), ("kimi_linear", {}, False), ("zamba2", {}, False), ("minimax", {}, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("family,overrides,captures", GPU_CASES)
@torch.no_grad()
def test_gpu_graphed_generate_equals_the_eager_loop(family, overrides, captures):
    """fp32 on the kernels: the captured loop's greedy tokens are the eager loop's (or, where the
    capture is refused, the fallback's are); one graph per batch size, recaptured when a prompt
    outgrows its keys' room."""
    from laquant.generate import _DecodeGraph

    torch.manual_seed(3)
    model = FAMILIES[family](**overrides).float().eval().cuda()
    install(model)
    assert is_graphable(model)
    for B, T, n in ((2, 13, 24), (2, 7, 30), (1, 1100, 9)):
        ids = torch.randint(0, VOCAB, (B, T), device="cuda")
        assert torch.equal(generate(model, ids, n), generate(model, ids, n, graphed=False)), (B, T, n)
    graphs = list(model.__dict__["_laquant_decode_graphs"].values())
    if captures or all(isinstance(g, _DecodeGraph) for g in graphs):
        assert sorted(g.cache.capacity for g in graphs) == [1024, 2048]  # B=2 once, B=1 with room for 1,109
        assert all(state_store(g.cache).static for g in graphs)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_next", "kimi_linear", "minimax"])
@torch.no_grad()
def test_gpu_bf16_moe_hybrids_are_captured(family):
    """In bf16 (how MoE hybrids are served) transformers' grouped GEMM stays on the device, so the MoE
    decode step is captured (fp32's is refused, above); its greedy tokens equal the eager loop's."""
    import warnings

    from laquant.generate import _DecodeGraph

    torch.manual_seed(3)
    model = FAMILIES[family]().to("cuda", torch.bfloat16).eval()
    install(model)
    ids = torch.randint(0, VOCAB, (2, 9), device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refused capture warns
        graphed = generate(model, ids, 8)
    assert all(isinstance(g, _DecodeGraph) for g in model.__dict__["_laquant_decode_graphs"].values())
    assert torch.equal(graphed, generate(model, ids, 8, graphed=False))


def _experts_modules(model):
    return [m for m in model.modules() if type(m).__name__.endswith("Experts")]


@torch.no_grad()
def test_decode_steps_pick_the_experts_implementation_by_gathered_bytes(monkeypatch):
    """A MoE decode step of B tokens runs batched_mm where that gathers at most BATCHED_MM_MAX_BYTES of a layer's
    expert weights (B x top-k experts), grouped_mm where more; a model without experts, or set to another
    implementation, keeps its setting."""
    import laquant.moe_experts as moe

    model = _model("qwen3_next")
    per_expert = max(sum(w[0].numel() * w.element_size() for w in (m.gate_up_proj, m.down_proj))
                     for m in _experts_modules(model))
    top_k = model.config.num_experts_per_tok
    assert moe.gathered_bytes(model, 3) == 3 * top_k * per_expert > 0
    monkeypatch.setattr(moe, "BATCHED_MM_MAX_BYTES", 3 * top_k * per_expert)
    assert model.get_experts_implementation()[""] == "grouped_mm"
    assert moe.decode_experts_implementation(model, 3) == {"": "batched_mm"}
    assert moe.decode_experts_implementation(model, 4) is None  # grouped_mm already
    model.set_experts_implementation("batched_mm")
    assert moe.decode_experts_implementation(model, 4) == {"": "grouped_mm"}
    assert moe.decode_experts_implementation(model, 1) is None
    model.set_experts_implementation("eager")
    assert moe.decode_experts_implementation(model, 1) is None
    dense = FAMILIES["qwen3_next"](num_experts=0)
    assert moe.gathered_bytes(dense, 1) == 0 and moe.decode_experts_implementation(dense, 1) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@torch.no_grad()
def test_gpu_decode_steps_run_the_experts_implementation_of_their_batch(dtype, monkeypatch):
    """laquant's loops on a MoE hybrid: the prefill runs the model's setting (grouped_mm), the decode steps
    batched_mm where a step gathers at most BATCHED_MM_MAX_BYTES of a layer's experts, grouped_mm where more,
    graphed and eager alike (the same tokens); the model's setting is left as it was. In float32, whose grouped_mm
    a capture refuses, the small batch's steps are now captured."""
    import warnings

    import laquant.moe_experts as moe
    from laquant.generate import _DecodeGraph

    torch.manual_seed(3)
    model = FAMILIES["qwen3_next"]().to("cuda", dtype).eval()
    install(model)
    experts = _experts_modules(model)
    ran = []
    for m in experts:
        m.register_forward_pre_hook(lambda mod, args: ran.append(mod.config._experts_implementation))
    monkeypatch.setattr(moe, "BATCHED_MM_MAX_BYTES", moe.gathered_bytes(model, 2))
    for B, steps_run in ((2, "batched_mm"), (3, "grouped_mm")):
        ids = torch.randint(0, VOCAB, (B, 9), device="cuda")
        out = {}
        for graphed in (False, True):
            ran.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # float32's grouped_mm capture is refused: the eager loop
                out[graphed] = generate(model, ids, 6, graphed=None if graphed else False)
            prefill, steps = ran[:len(experts)], ran[len(experts):]
            assert set(prefill) == {"grouped_mm"} and steps and set(steps) == {steps_run}, (B, graphed)
        assert torch.equal(out[True], out[False]), B
        assert model.get_experts_implementation()[""] == "grouped_mm"
    captured = {key[0] for key, g in model.__dict__["_laquant_decode_graphs"].items() if isinstance(g, _DecodeGraph)}
    assert captured == ({2, 3} if dtype == torch.bfloat16 else {2})


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_next", "nemotron_h"])
@torch.no_grad()
def test_gpu_graphed_perplexity_of_hybrid_int8(family):
    """bf16 with hybrid_int8's 8-bit states (stochastic rounding, drawn from the device counter): the
    graphed decode-mode perplexity against the eager loop's."""
    from conftest import graphed_and_eager_perplexity

    import laquant

    model = _installed(family, torch.bfloat16, "cuda")
    laquant.calibrate(model, "hybrid_int8", torch.randint(0, VOCAB, (2, 128), device="cuda"), progress=False)
    ids = torch.randint(0, VOCAB, (600,))
    graphed, eager = graphed_and_eager_perplexity(model, ids, context=96, stride=48, batch_size=4)
    assert graphed.nll == pytest.approx(eager.nll, rel=2e-3)
