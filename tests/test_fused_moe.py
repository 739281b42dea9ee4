"""MoE blocks in fewer launches (laquant.models.fused_moe): the router's choice of experts (laquant.kernels.moe.route)
and Qwen3-Next's gated shared-expert sum (laquant.kernels.moe.combine), each kernel against its spec (interpreted on
CPU; on the GPU at released models' sizes), the specs and the fused forwards against each family's transformers
modules, and the first-use check that keeps transformers' forward where they differ."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, rel_err, require_triton_kernels
from test_hybrid import VOCAB, _model

from laquant.adapters import install
from laquant.kernels.moe.reference import gated_shared_sum, route
from laquant.models import fused_moe

# (routing, T, E, k, keyword arguments): odd expert counts, top-1, every expert chosen, renormalized or not, groups
CASES = [("softmax", 7, 60, 4, {}), ("softmax", 3, 5, 5, dict(renormalize=False)), ("softmax", 1, 32, 1, {}),
         ("topk_softmax", 9, 40, 2, {}), ("topk_softmax", 2, 3, 3, {}),
         ("grouped_sigmoid", 6, 64, 6, dict(n_group=8, topk_group=4, scale=2.5)),
         ("grouped_sigmoid", 5, 48, 3, dict(n_group=3, topk_group=2, renormalize=False)),
         ("grouped_sigmoid", 4, 12, 2, dict(n_group=1, topk_group=1, scale=1.5)),
         # released models' sizes: Qwen3-Next-80B (512 experts, top-10) at a decode batch, Kimi-Linear-48B / DeepSeek
         # (256 in 8 groups, 4 kept, top-8)
         pytest.param("softmax", 64, 512, 10, {}, marks=pytest.mark.gpu),
         pytest.param("grouped_sigmoid", 300, 256, 8, dict(n_group=8, topk_group=4, scale=2.446),
                      marks=pytest.mark.gpu)]


def _logits(T, E, routing, gen, dtype=torch.float32):
    """Distinct logits (no ties at the k-th place) and, for the grouped routing, a bias that changes the choice."""
    x = torch.randn(T, E, generator=gen, dtype=torch.float64)
    x = (x + torch.arange(E, dtype=torch.float64) * 1e-3).to(dtype)
    bias = torch.randn(E, generator=gen) * 0.3 if routing == "grouped_sigmoid" else None
    return x.to(DEVICE), None if bias is None else bias.to(DEVICE)


@pytest.mark.parametrize("routing, T, E, k, kw", CASES)
def test_route_kernel_matches_the_spec(routing, T, E, k, kw):
    require_triton_kernels()
    from laquant.kernels.moe.route import route_triton

    gen = torch.Generator().manual_seed(T * 7 + E)
    logits, bias = _logits(T, E, routing, gen)
    args = dict(kw, bias=bias) if bias is not None else kw
    w_ref, i_ref = route(logits, k, routing, **args)
    w, i = route_triton(logits, k, routing, **args)
    assert torch.equal(i, i_ref) and i.dtype == torch.int64
    assert w.dtype == torch.float32 and torch.isfinite(w).all()
    assert ((w - w_ref).abs() <= 4e-7 * w_ref.abs()).all()
    if routing == "grouped_sigmoid" and kw["n_group"] > 1:  # the groups bind (else this case tests nothing of them)
        assert not torch.equal(i_ref, route(logits, k, routing, **dict(args, n_group=1, topk_group=1))[1])


def test_route_kernel_ties_nan_and_dtypes():
    require_triton_kernels()
    from laquant.kernels.moe.route import route_triton

    tied = torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0, 0.5]], device=DEVICE)
    w, i = route_triton(tied, 2, "topk_softmax")
    assert i.tolist() == [[1, 3]]  # ties: the lower expert index, in order
    assert torch.allclose(w, torch.full_like(w, 0.5))
    nan = torch.tensor([[0.1, float("nan"), 0.3, 0.2]], device=DEVICE)
    w, i = route_triton(nan, 2, "softmax")
    assert ((i >= 0) & (i < 4)).all() and torch.isnan(w).all()  # a NaN row is visible, never an index out of range
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(1)).to(DEVICE, torch.bfloat16)
    w, i = route_triton(x, 3, "softmax", out_dtype=torch.bfloat16)
    w_ref, i_ref = route(x, 3, "softmax", out_dtype=torch.bfloat16)
    # bf16 logits tie (equal probabilities): torch's order among them is its own, so the experts compare as sets;
    # the weights one bf16 ulp apart at most (the interpreter truncates to bf16 where the GPU rounds to nearest)
    assert w.dtype == torch.bfloat16 and fused_moe.routing_agrees((None, w, i), (None, w_ref, i_ref)) is None
    assert torch.equal(i.sort(-1)[0], i_ref.sort(-1)[0])
    w, i = route_triton(x[:0], 3, "softmax")
    assert w.shape == (0, 3) and i.shape == (0, 3)


@pytest.mark.parametrize("args, message", [((4, 5, "softmax"), "top_k must be in"),
                                           ((4, 2, "sparsemax"), "routing must be one of"),
                                           ((4, 2, "grouped_sigmoid"), "needs a bias"),
                                           ((4, 2, "grouped_sigmoid", True, torch.float32, torch.zeros(4), 3),
                                            "cannot form"),
                                           ((8, 5, "grouped_sigmoid", True, torch.float32, torch.zeros(8), 4, 2),
                                            "hold fewer than")])
def test_route_rejects_what_it_cannot_route(args, message):
    E, *rest = args
    with pytest.raises(ValueError, match=message):
        route(torch.randn(3, E), *rest)


# the tiny test configs' MoE families (tests/test_hybrid.py) and where their first router sits
ROUTER_FAMILIES = {"qwen3_next": "model.layers.1.mlp.gate", "minimax": "model.layers.0.mlp.gate",
                   "qwen3_5_moe": "model.layers.0.mlp.gate", "nemotron_h": "model.layers.1.mixer.gate",
                   "kimi_linear": "model.layers.1.mlp.gate", "bailing_hybrid": "model.layers.1.mlp.gate",
                   "granitemoehybrid": "model.layers.0.block_sparse_moe.router"}


@pytest.fixture
def fresh_checks(monkeypatch):
    """The fused forward taken on this device (interpreted on CPU), each class checked anew."""
    monkeypatch.setattr(fused_moe, "_CHECKED", {})
    monkeypatch.setattr(fused_moe, "_LAYOUTS", {})
    monkeypatch.setattr(fused_moe, "use_triton", lambda x: True)


def _router(family, dtype):
    model = _model(family)
    try:
        router = model.get_submodule(ROUTER_FAMILIES[family])
    except AttributeError:
        pytest.skip(f"this transformers has no {family} router at {ROUTER_FAMILIES[family]}")
    if hasattr(router, "e_score_correction_bias"):  # transformers initializes it to zeros: give it a say
        router.e_score_correction_bias.copy_(torch.randn(router.e_score_correction_bias.shape) * 0.3)
    return model, router.to(DEVICE, dtype)


@pytest.mark.parametrize("family", list(ROUTER_FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_routing_reproduces_each_family(family, dtype, fresh_checks):
    """The table's formula for each router class is what the installed transformers computes: the spec from the
    router's logits, and the fused forward (kernel) against transformers' forward."""
    require_triton_kernels()
    model, router = _router(family, dtype)
    form = fused_moe.ROUTERS[type(router).__name__]
    assert install(model) is not None and type(router).__name__ in fused_moe.ROUTERS
    assert isinstance(router, fused_moe._FusedRouting)
    x = torch.randn(9, router.weight.shape[1], generator=torch.Generator().manual_seed(5)).to(DEVICE, dtype)
    with torch.no_grad():
        theirs = router._laquant_base.forward(router, x)
        ours = router(x)
    assert fused_moe._CHECKED == {router._laquant_base: True}
    layout = fused_moe.output_layout(theirs, router.weight.shape[0], router.top_k)  # transformers' order of outputs
    assert layout is not None and fused_moe._LAYOUTS == {router._laquant_base: layout}
    ours, theirs = (tuple(t[n] for n in layout) for t in (ours, theirs))  # (logits, weights, indices)
    assert torch.equal(ours[0], theirs[0])  # the same logits, from the same GEMM
    assert fused_moe.routing_agrees(ours, theirs) is None
    assert torch.equal(ours[2].sort(-1)[0], theirs[2].sort(-1)[0])
    assert ours[1].dtype == theirs[1].dtype
    # the spec, from transformers' logits with the table's settings
    w, i = route(theirs[0], **fused_moe.route_arguments(router, form, theirs[0], x.dtype))
    assert fused_moe.routing_agrees((None, w, i), theirs) is None


def test_the_switch_keeps_transformers_forward(fresh_checks, monkeypatch):
    require_triton_kernels()
    model, router = _router("minimax", torch.float32)
    install(model)
    monkeypatch.setenv("LAQUANT_FUSED_MOE", "0")
    x = torch.randn(4, router.weight.shape[1], generator=torch.Generator().manual_seed(3)).to(DEVICE)
    with torch.no_grad():
        got, theirs = router(x), router._laquant_base.forward(router, x)
    assert fused_moe._CHECKED == {} and all(torch.equal(a, b) for a, b in zip(got, theirs))


def test_a_router_that_differs_keeps_transformers_forward(fresh_checks, monkeypatch):
    """A router class whose forward does not match its table entry (as a transformers release could change it) is
    warned about once and runs transformers' forward from then on."""
    require_triton_kernels()
    model, router = _router("qwen3_next", torch.float32)
    install(model)
    name = type(router).__name__
    monkeypatch.setitem(fused_moe.ROUTERS, name, fused_moe.ROUTERS[name]._replace(renormalize=False))
    x = torch.randn(6, router.weight.shape[1], generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad():
        theirs = router._laquant_base.forward(router, x)
        with pytest.warns(UserWarning, match=f"fused forward of {name} does not reproduce"):
            first = router(x)
        second = router(x)
    assert fused_moe._CHECKED == {router._laquant_base: False}
    for got in (first, second):
        assert all(torch.equal(a, b) for a, b in zip(got, theirs))


def test_a_router_returning_another_order_gets_its_order(fresh_checks, monkeypatch):
    """transformers 5.17's Granite 4 router returned (indices, weights, logits): the fused forward returns what the
    router's forward returns, in its order."""
    require_triton_kernels()
    model, router = _router("qwen3_next", torch.float32)
    install(model)
    base = router._laquant_base
    forward = base.forward
    monkeypatch.setattr(base, "forward", lambda self, h: tuple(reversed(forward(self, h))))
    x = torch.randn(5, router.weight.shape[1], generator=torch.Generator().manual_seed(8)).to(DEVICE)
    with torch.no_grad():
        theirs = forward(router, x)
        first, second = router(x), router(x)
    assert fused_moe._CHECKED == {base: True} and fused_moe._LAYOUTS == {base: (2, 1, 0)}
    for got in (first, second):
        assert got[2].shape == theirs[0].shape and got[0].dtype == torch.int64
        assert fused_moe.routing_agrees(tuple(reversed(got)), theirs) is None


def test_output_layout_reads_where_each_output_sits():
    logits, weights, idx = torch.randn(3, 8), torch.rand(3, 2), torch.zeros(3, 2, dtype=torch.int64)
    assert fused_moe.output_layout((logits, weights, idx), 8, 2) == (0, 1, 2)
    assert fused_moe.output_layout((idx, weights, logits), 8, 2) == (2, 1, 0)
    assert fused_moe.output_layout((torch.randn(3, 2), torch.rand(3, 2), idx), 2, 2) == (0, 1, 2)  # k = E: in order
    assert fused_moe.output_layout((logits, weights), 8, 2) is None
    assert fused_moe.output_layout((logits, weights, weights), 8, 2) is None
    assert fused_moe.arranged(("l", "w", "i"), (2, 1, 0)) == ("i", "w", "l")


def test_routing_agrees_names_what_differs():
    w = torch.tensor([[0.6, 0.4], [0.7, 0.3]])
    i = torch.tensor([[2, 0], [1, 3]])
    assert fused_moe.routing_agrees((None, w, i), (None, w[:, [1, 0]], i[:, [1, 0]])) is None  # order is free
    assert "other experts for 2 of 2" in fused_moe.routing_agrees((None, w, i), (None, w, i + 1))
    # one token of one: other experts with other weights are not a tie
    assert "other experts for 1 of 1" in fused_moe.routing_agrees((None, w[:1], i[:1]), (None, w[1:], i[:1] + 1))
    # a tie at the k-th place: other experts, the same weights
    tie_w, tie_i = torch.tensor([[0.5, 0.25, 0.25]]), torch.tensor([[4, 1, 2]])
    assert fused_moe.routing_agrees((None, tie_w, tie_i), (None, tie_w, torch.tensor([[4, 1, 3]]))) is None
    assert "weights off" in fused_moe.routing_agrees((None, w * 1.01, i), (None, w, i))
    assert "weights torch.bfloat16" in fused_moe.routing_agrees((None, w.bfloat16(), i), (None, w, i))


@pytest.mark.gpu
def test_route_kernel_replays_in_a_cuda_graph():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from laquant.kernels.moe.route import route_triton

    logits = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    route_triton(logits, 10, "softmax", out_dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w, i = route_triton(logits, 10, "softmax", out_dtype=torch.bfloat16)
    logits.copy_(torch.randn_like(logits))
    graph.replay()
    w_ref, i_ref = route_triton(logits, 10, "softmax", out_dtype=torch.bfloat16)
    assert torch.equal(i, i_ref) and torch.equal(w, w_ref)



@pytest.mark.parametrize("T, H, dtype", [(3, 72, torch.float32), (1, 1100, torch.float32), (0, 16, torch.float32),
                                         pytest.param(64, 2048, torch.bfloat16, marks=pytest.mark.gpu),
                                         pytest.param(7, 4096, torch.bfloat16, marks=pytest.mark.gpu)])
def test_gated_shared_sum_kernel_matches_the_spec(T, H, dtype):
    require_triton_kernels()
    from laquant.kernels.moe.combine import gated_shared_sum_triton

    gen = torch.Generator().manual_seed(T + H)
    x, shared, routed = (torch.randn(T, H + 8, generator=gen).to(DEVICE, dtype)[:, :H] for _ in range(3))  # strided
    gate_weight = (torch.randn(1, H, generator=gen) / H ** 0.5).to(DEVICE, dtype)
    want, got = gated_shared_sum(x, gate_weight, shared, routed), gated_shared_sum_triton(x, gate_weight, shared,
                                                                                          routed)
    assert got.dtype == dtype and got.shape == (T, H) and torch.isfinite(got).all()
    if T:
        assert fused_moe.outputs_agree(got, want) is None
        assert rel_err(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)
    with pytest.raises(ValueError, match="share a dtype"):
        gated_shared_sum_triton(x, gate_weight.double(), shared, routed)


@pytest.mark.parametrize("T, k, H, dtype", [(3, 3, 72, torch.float32), (1, 1, 1100, torch.float32),
                                            (5, 2, 40, torch.bfloat16),
                                            pytest.param(64, 4, 2048, torch.bfloat16, marks=pytest.mark.gpu)])
def test_gated_shared_sum_of_the_experts_pairs_is_their_sum_bit_for_bit(T, k, H, dtype):
    """The gated shared sum reading the int8 experts' float32 pairs gives what it gives on their sum as the experts'
    last launch rounds it (summed in order, rounded once to the dtype), bit for bit."""
    require_triton_kernels()
    from laquant.kernels.moe.combine import gated_shared_sum_triton
    from laquant.kernels.moe.grouped import sum_pairs_triton

    gen = torch.Generator().manual_seed(T * k + H)
    x, shared = (torch.randn(T, H + 8, generator=gen).to(DEVICE, dtype)[:, :H] for _ in range(2))  # strided rows
    gate_weight = (torch.randn(1, H, generator=gen) / H ** 0.5).to(DEVICE, dtype)
    pairs = (torch.randn(T * k, H, generator=gen) * 3).to(DEVICE)
    routed = sum_pairs_triton(pairs, k, dtype)  # what the int8 experts' forward returns from these pairs
    want = gated_shared_sum_triton(x, gate_weight, shared, routed)
    got = gated_shared_sum_triton(x, gate_weight, shared, pairs, k)
    assert torch.isfinite(got).all() and torch.equal(got, want)
    assert rel_err(routed, pairs.view(T, k, H).sum(1)) < (1e-6 if dtype == torch.float32 else 1e-2)
    with pytest.raises(ValueError, match=r"routed \[%d, %d\]" % (T * k, H)):
        gated_shared_sum_triton(x, gate_weight, shared, pairs[1:], k)
    with pytest.raises(ValueError, match="routed be torch.float32"):
        gated_shared_sum_triton(x, gate_weight, shared, pairs.to(dtype if dtype != torch.float32 else torch.half), k)


def test_a_quantized_block_sums_its_experts_pairs_in_the_shared_sum(fresh_checks, monkeypatch):
    """qwen3_next's MoE block with laquant's int8 experts: the fused forward hands the experts' pairs to the shared
    sum (the experts' own sum launch not made) and gives what the experts' forward then the shared sum give, bit for
    bit."""
    require_triton_kernels()
    from laquant.api import calibrate
    from laquant.kernels.moe import grouped
    from laquant.quant import experts as quant_experts
    from laquant.recipe import load_recipe

    model = _model("qwen3_next")
    install(model)
    data = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    model = calibrate(model, load_recipe("hybrid_int8"), data=data, progress=False).model.to(DEVICE)
    block = model.get_submodule("model.layers.1.mlp")
    assert type(block.experts).__name__ == "QuantExperts" and isinstance(block, fused_moe._FusedGatedShared)
    monkeypatch.setattr(quant_experts, "use_triton", lambda x: True)
    sums = []
    real_sum = grouped.int8_experts_triton
    monkeypatch.setattr(grouped, "int8_experts_triton", lambda *a, **kw: sums.append(1) or real_sum(*a, **kw))
    x = torch.randn(2, 5, block.gate.weight.shape[1], generator=torch.Generator().manual_seed(4)).to(DEVICE)
    with torch.no_grad():
        block(x)  # the first-use check against transformers' forward
        assert fused_moe._CHECKED[block._laquant_base] is True
        sums.clear()
        got = block(x)
        assert sums == []
        monkeypatch.setattr(type(block.experts), "pair_outputs", lambda self, *a: None)
        want = block(x)
    assert sums == [1] and torch.isfinite(got).all() and torch.equal(got, want)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_fused_gated_shared_block_reproduces_transformers(family, fresh_checks, monkeypatch):
    require_triton_kernels()
    model, _ = _router(family, torch.float32)
    install(model)
    block = model.get_submodule(ROUTER_FAMILIES[family].rsplit(".", 1)[0]).to(DEVICE)
    assert isinstance(block, fused_moe._FusedGatedShared)
    calls = []
    from laquant.kernels.moe import combine

    real = combine.gated_shared_sum_triton
    monkeypatch.setattr(combine, "gated_shared_sum_triton", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(2, 5, block.gate.weight.shape[1], generator=torch.Generator().manual_seed(4)).to(DEVICE)
    with torch.no_grad():
        theirs = block._laquant_base.forward(block, x)
        ours = block(x)
        again = block(x)
    assert calls == [1, 1] and fused_moe._CHECKED[block._laquant_base] is True
    assert fused_moe.outputs_agree(ours, theirs) is None and torch.equal(ours, again)
    # a hook on the shared expert's gate (which the fused forward does not call) keeps transformers' forward
    seen = []
    block.shared_expert_gate.register_forward_hook(lambda *a: seen.append(1))
    with torch.no_grad():
        assert torch.equal(block(x), theirs)
    assert seen == [1] and calls == [1, 1]


def test_a_block_that_differs_keeps_transformers_forward(fresh_checks, monkeypatch):
    require_triton_kernels()
    model, _ = _router("qwen3_next", torch.float32)
    install(model)
    block = model.get_submodule("model.layers.1.mlp").to(DEVICE)
    real = fused_moe._gated_shared_block
    monkeypatch.setattr(fused_moe, "_gated_shared_block", lambda b, h: real(b, h) * 1.01)
    x = torch.randn(1, 3, block.gate.weight.shape[1], generator=torch.Generator().manual_seed(6)).to(DEVICE)
    with torch.no_grad():
        theirs = block._laquant_base.forward(block, x)
        with pytest.warns(UserWarning, match="fused forward of Qwen3NextSparseMoeBlock does not reproduce"):
            first = block(x)
        second = block(x)
    assert torch.equal(first, theirs) and torch.equal(second, theirs)


@pytest.mark.parametrize("family", list(ROUTER_FAMILIES))
def test_whole_models_decode_alike_with_the_fused_blocks(family, fresh_checks, monkeypatch):
    """A prompt and two decode steps of each MoE family's tiny model through laquant's adapters: the fused routers
    and blocks (interpreted) give transformers' logits and choose no fallback."""
    require_triton_kernels()
    try:
        model = _model(family).to(DEVICE)
    except (AttributeError, ImportError, KeyError):
        pytest.skip(f"this transformers has no {family}")
    install(model)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    from laquant.adapters import cache_kwargs, new_cache

    def run():
        cache = new_cache(model)
        out = [model(input_ids=ids[:, :5], **cache_kwargs(model, cache), use_cache=True).logits[:, -1]]
        for t in (5, 6):
            out.append(model(input_ids=ids[:, t:t + 1], **cache_kwargs(model, cache), use_cache=True).logits[:, -1])
        return torch.stack(out)

    with torch.no_grad():
        monkeypatch.setenv("LAQUANT_FUSED_MOE", "0")
        want = run()
        monkeypatch.setenv("LAQUANT_FUSED_MOE", "1")
        got = run()
    assert fused_moe._CHECKED and all(fused_moe._CHECKED.values())  # every fused class ran and matched
    assert torch.isfinite(got).all() and rel_err(got, want) < 1e-5
