"""MoE experts with int8 weights (laquant.quant.experts, laquant.kernels.moe): the grouped kernels against their
spec (interpreted on CPU, float32; bf16 on the GPU), the module against each family's transformers experts, and the
recipe, checkpoint and export paths that carry them."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import DEVICE, INTERPRETED, rel_err, require_triton_kernels
from test_hybrid import FAMILIES, VOCAB

import laquant
from laquant.errors import LaquantError
from laquant.kernels.moe.reference import int8_experts
from laquant.quant.experts import QuantExperts, unsupported_reason
from laquant.recipe import load_recipe

DTYPE = torch.float32 if INTERPRETED else torch.bfloat16
# the families whose tiny configs have routed experts, and where the experts module sits
MOE_FAMILIES = {"qwen3_next": "model.layers.1.mlp.experts", "minimax": "model.layers.0.mlp.experts",
                "qwen3_5_moe": "model.layers.0.mlp.experts", "nemotron_h": "model.layers.1.mixer.experts",
                "kimi_linear": "model.layers.1.mlp.experts", "bailing_hybrid": "model.layers.1.mlp.experts",
                "granitemoehybrid": "model.layers.0.block_sparse_moe.experts"}


def _experts(E, H, I, gated, gen, device="cpu"):
    n_in = 2 * I if gated else I
    codes_in = torch.randint(-127, 128, (E, n_in, H), generator=gen, dtype=torch.int8)
    codes_out = torch.randint(-127, 128, (E, H, I), generator=gen, dtype=torch.int8)
    scale_in = (torch.rand(E, n_in, generator=gen) + 0.5) / (127 * H ** 0.5)
    scale_out = (torch.rand(E, H, generator=gen) + 0.5) / (127 * I ** 0.5)
    return [t.to(device) for t in (codes_in, scale_in, codes_out, scale_out)]


def _routing(T, k, E, gen, device="cpu"):
    index = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)]) if T else torch.zeros(0, k).long()
    weights = torch.rand(T, k, generator=gen).softmax(-1)
    return index.to(device), weights.to(device)


# (T, k, E, H, I, gated, activation, limit): odd sizes; a few pairs an expert (16-row blocks), more (32) and many
# (64-row blocks); one token; top-1; every expert chosen by all tokens
CASES = [(5, 2, 4, 40, 24, True, "silu", None), (33, 3, 7, 72, 40, False, "relu2", None),
         (1, 1, 3, 16, 8, True, "silu", None), (70, 2, 4, 48, 40, True, "silu", 0.3),
         (9, 4, 4, 24, 56, True, "silu", None), (50, 2, 4, 56, 40, True, "silu", None),
         # released models' widths (whole tiles, long K loops), a decode batch and a prefill: too slow interpreted
         pytest.param(64, 8, 64, 2048, 512, True, "silu", None, marks=pytest.mark.gpu),
         pytest.param(1, 10, 512, 2048, 512, True, "silu", None, marks=pytest.mark.gpu),
         pytest.param(1000, 2, 8, 2304, 1408, True, "silu", None, marks=pytest.mark.gpu),
         pytest.param(300, 6, 16, 1024, 768, False, "relu2", None, marks=pytest.mark.gpu)]


@pytest.mark.parametrize("T, k, E, H, I, gated, activation, limit", CASES)
def test_grouped_kernels_match_the_reference(T, k, E, H, I, gated, activation, limit):
    require_triton_kernels()
    from laquant.kernels.moe.grouped import int8_experts_triton

    gen = torch.Generator().manual_seed(T * 31 + E)
    weights = _experts(E, H, I, gated, gen, DEVICE)
    index, routing = _routing(T, k, E, gen, DEVICE)
    x = torch.randn(T, H, generator=gen).to(DEVICE, DTYPE)
    args = (x, index, routing, *weights, activation, gated, limit)
    want, got = int8_experts(*args), int8_experts_triton(*args)
    assert got.dtype == x.dtype and got.shape == x.shape and torch.isfinite(got).all()
    assert rel_err(got, want) < (1e-5 if INTERPRETED else 1e-2)
    if limit is not None:  # the limit binds somewhere (else this case tests nothing of it)
        assert rel_err(int8_experts(*args[:-1], None), want) > 1e-3


def _case(T, k, E, H, I, seed):
    """A gated SiLU layer's arguments on DEVICE, tokens in DTYPE."""
    gen = torch.Generator().manual_seed(seed)
    weights = _experts(E, H, I, True, gen, DEVICE)
    index, routing = _routing(T, k, E, gen, DEVICE)
    x = torch.randn(T, H, generator=gen).to(DEVICE, DTYPE)
    return (x, index, routing, *weights, "silu", True)


@pytest.mark.parametrize("tiles", [(16, 64, 128, 128), (32, 128, 32, 64), (64, 32, 64, 128, 8)])
def test_grouped_kernels_match_the_reference_at_other_tiles(tiles):
    """The tiles the rule picks at this size are one choice; a sweep's (``tiles=``) must compute the same."""
    require_triton_kernels()
    from laquant.kernels.moe.grouped import Tiles, int8_experts_triton

    args = _case(40, 2, 5, 136, 72, seed=11)
    got = int8_experts_triton(*args, tiles=Tiles(*tiles))
    assert torch.isfinite(got).all() and rel_err(got, int8_experts(*args)) < (1e-5 if INTERPRETED else 1e-2)


def test_a_prefill_aligns_its_pairs_by_the_pytorch_spec(monkeypatch):
    """Above ALIGN_ONE_LAUNCH_MAX_PAIRS pairs the kernels take the PyTorch alignment (faster there); same result."""
    require_triton_kernels()
    from laquant.kernels.moe import grouped

    args = _case(30, 2, 6, 40, 24, seed=12)
    one_launch = grouped.int8_experts_triton(*args)
    monkeypatch.setattr(grouped, "ALIGN_ONE_LAUNCH_MAX_PAIRS", 0)
    monkeypatch.setattr(grouped, "align_pairs", None)  # not called
    assert torch.equal(grouped.int8_experts_triton(*args), one_launch)


@pytest.mark.parametrize("index", [[4, 0, 2], [1, 1, 3]])
def test_one_token_takes_a_block_a_pair_without_the_alignment(monkeypatch, index):
    """One token's pairs are each a block of their own (no alignment launch), in the router's order, whatever the
    experts' order; a router that picks an expert twice still gets both pairs' sum."""
    require_triton_kernels()
    from laquant.kernels.moe import grouped

    x, _, _, *weights = _case(1, 3, 5, 40, 24, seed=13)[:7]
    index = torch.tensor([index], device=DEVICE)
    routing = torch.tensor([[0.5, 0.3, 0.2]], device=DEVICE)
    monkeypatch.setattr(grouped, "align_pairs", None)  # neither is called
    monkeypatch.setattr(grouped, "align_pairs_reference", None)
    args = (x, index, routing, *weights, "silu", True)
    got = grouped.int8_experts_triton(*args)
    assert torch.isfinite(got).all() and rel_err(got, int8_experts(*args)) < (1e-5 if INTERPRETED else 1e-2)


def test_an_empty_batch_and_an_unknown_activation():
    """No tokens: an empty output from both paths (the kernels launch nothing); an activation the kernels lack: the
    same error from both, whether or not any token is routed."""
    gen = torch.Generator().manual_seed(3)
    weights = _experts(3, 16, 8, True, gen)
    paths = [int8_experts]
    if not INTERPRETED or require_triton_kernels():
        from laquant.kernels.moe.grouped import int8_experts_triton

        paths.append(int8_experts_triton)
    for path in paths:
        for T in (0, 2):
            x = torch.randn(T, 16, generator=gen)
            index, routing = _routing(T, 2, 3, gen)
            args = [t.to(DEVICE) for t in (x, index, routing, *weights)]
            if T == 0:
                assert path(*args, "silu", True).shape == (0, 16), path.__name__
            with pytest.raises(ValueError, match="activation must be one of"):
                path(*args, "gelu", True)


@pytest.mark.parametrize("T, k, E", [(37, 3, 6), (1, 10, 512), (300, 4, 700), (1000, 2, 8)])
def test_pairs_are_aligned_to_blocks_of_one_expert(T, k, E):
    """The one-launch alignment against its PyTorch spec: the same blocks' experts and, in each expert's blocks, the
    same pairs (their order inside an expert's blocks may differ: the kernel takes rows by atomics)."""
    from laquant.kernels.moe.grouped import align_pairs_reference

    gen = torch.Generator().manual_seed(T + E)
    index, _ = _routing(T, k, E, gen)
    index[: T // 2, 0] = 2  # one expert takes many pairs
    paths = [align_pairs_reference]
    if not INTERPRETED or require_triton_kernels():
        from laquant.kernels.moe.grouped import align_pairs

        paths.append(align_pairs)
    S = index.numel()
    for block in (16, 64):
        want_experts = None
        for path in paths:
            pairs, block_expert = (t.cpu() for t in path(index.to(DEVICE), E, block))
            real = pairs[pairs < S]
            assert sorted(real.tolist()) == list(range(S)), path.__name__  # every pair once
            per_expert = {}
            for b, e in enumerate(block_expert.tolist()):
                rows = pairs[b * block:(b + 1) * block]
                rows = rows[rows < S]
                if e >= E:
                    assert rows.numel() == 0
                else:
                    assert (index.reshape(-1)[rows.long()] == e).all(), path.__name__
                    per_expert.setdefault(e, []).extend(rows.tolist())
            if want_experts is None:
                want_experts, want_pairs = block_expert, per_expert
            else:
                assert torch.equal(block_expert, want_experts), path.__name__
                assert {e: sorted(p) for e, p in per_expert.items()} == {e: sorted(p) for e, p in want_pairs.items()}


def test_experts_no_token_chose_are_not_read():
    gen = torch.Generator().manual_seed(2)
    codes_in, scale_in, codes_out, scale_out = _experts(5, 32, 16, True, gen)
    index = torch.tensor([[0, 3], [3, 1], [1, 0]])
    routing = torch.rand(3, 2, generator=gen)
    x = torch.randn(3, 32, generator=gen)
    want = int8_experts(x, index, routing, codes_in, scale_in, codes_out, scale_out, "silu", True)
    scale_in[[2, 4]] = float("nan")
    scale_out[[2, 4]] = float("nan")
    paths = [int8_experts]
    if not INTERPRETED or require_triton_kernels():
        from laquant.kernels.moe.grouped import int8_experts_triton

        paths.append(int8_experts_triton)
    for path in paths:
        got = path(x.to(DEVICE), index.to(DEVICE), routing.to(DEVICE), codes_in.to(DEVICE), scale_in.to(DEVICE),
                   codes_out.to(DEVICE), scale_out.to(DEVICE), "silu", True)
        assert torch.allclose(got.cpu(), want, rtol=1e-5, atol=1e-6), path.__name__


def _family_experts(family, **config):
    torch.manual_seed(4)
    model = FAMILIES[family](**config).float().eval()
    return model.get_submodule(MOE_FAMILIES[family])


@pytest.mark.parametrize("family", MOE_FAMILIES)
@torch.no_grad()
def test_int8_experts_compute_what_transformers_experts_compute(family):
    """The module on its int8 weights equals the family's own experts module run on those weights dequantized
    (float32), and is close to it on the original weights (the int8 rounding alone)."""
    config = {"swiglu_limits": [0, 0.05, 0, 0.05]} if family == "bailing_hybrid" else {}
    experts = _family_experts(family, **config)
    assert unsupported_reason(experts) is None
    quantized = QuantExperts.from_experts(experts)
    assert quantized.in_qweight.dtype == torch.int8 and quantized.out_qweight.dtype == torch.int8
    if family == "bailing_hybrid":
        assert quantized.limit == 0.05
    H, E = quantized.hidden_size, quantized.num_experts
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(11, H, generator=gen)
    index, routing = _routing(11, 2, E, gen)
    original = experts(x, index, routing)
    w_in, w_out = quantized.dequantized()
    experts.get_parameter("gate_up_proj" if quantized.gated else "up_proj").copy_(w_in)
    experts.down_proj.copy_(w_out)
    assert rel_err(quantized(x, index, routing), experts(x, index, routing)) < 1e-5
    assert 0 < rel_err(quantized(x, index, routing), original) < 0.02


def test_experts_of_another_form_stay_as_they_are():
    experts = _family_experts("qwen3_next")
    experts.has_bias = True
    assert unsupported_reason(experts) == "biases"
    with pytest.raises(ValueError, match="biases"):
        QuantExperts.shaped_like(experts)


def _calibrate(family, *sets):
    torch.manual_seed(3)
    model = FAMILIES[family]().float().eval()
    result = laquant.calibrate(model, load_recipe("hybrid_int8", list(sets)), torch.randint(0, VOCAB, (2, 48)),
                               progress=False)
    return model, result


@torch.no_grad()
def test_hybrid_int8_quantizes_the_experts_and_keep_wins(tmp_path):
    ids = torch.randint(0, VOCAB, (2, 40))
    torch.manual_seed(3)
    base = FAMILIES["qwen3_next"]().float().eval()(input_ids=ids).logits
    model, result = _calibrate("qwen3_next")
    names = [n for n, m in model.named_modules() if n.endswith(".experts")]
    assert names and sorted(result.decisions.experts) == names
    assert all(isinstance(model.get_submodule(n), QuantExperts) for n in names)
    assert result.decisions.to_dict()["experts"][names[0]] == {"format": "int8", "weight_granularity": "per_channel",
                                                               "activation": "silu", "gated": True, "limit": None}
    quant = model(input_ids=ids).logits
    assert rel_err(quant, base) < 0.05
    laquant.save(result, tmp_path / "q")
    stored = {}
    from safetensors import safe_open

    with safe_open(str(tmp_path / "q" / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            if ".experts." in key:
                stored[key] = f.get_tensor(key).dtype
    assert stored and all(dtype == (torch.float32 if key.endswith("_scale") else torch.int8)
                          for key, dtype in stored.items())
    reloaded, _ = laquant.load(tmp_path / "q")
    assert torch.equal(reloaded(input_ids=ids).logits, quant)
    for sets in (["experts.format=keep"], ["keep=embeddings,norms,lm_head,routers,experts,conv,decay"]):
        kept, result = _calibrate("qwen3_next", *sets)
        assert "experts" not in result.decisions.to_dict()  # the JSON of a model without int8 experts, as before
        assert not any(isinstance(m, QuantExperts) for m in kept.modules())


def test_a_checkpoint_of_other_experts_fails_to_load(tmp_path):
    _, result = _calibrate("qwen3_next")
    laquant.save(result, tmp_path / "q")
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    name = next(iter(config["quantization_config"]["decisions"]["experts"]))
    config["hidden_act"] = "relu2"  # the model built for the checkpoint now has other experts than it was made from
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    with pytest.raises(LaquantError, match=f"{name}: the checkpoint's experts are silu .*, this model's relu2"):
        laquant.load(tmp_path / "q")


@pytest.mark.gpu
@torch.no_grad()
def test_int8_experts_replay_in_a_cuda_graph():
    """The routing's sort and block alignment have fixed shapes and no host synchronization: one captured call
    replays other routings of the same size exactly as eager calls compute them."""
    gen = torch.Generator().manual_seed(6)
    module = QuantExperts(64, 256, 160, True, "silu").cuda()
    codes_in, scale_in, codes_out, scale_out = _experts(64, 256, 160, True, gen, "cuda")
    module.in_qweight.copy_(codes_in), module.in_scale.copy_(scale_in)
    module.out_qweight.copy_(codes_out), module.out_scale.copy_(scale_out)
    for T in (32, 1):  # one token takes no alignment: its blocks read the router's indices as they are at replay
        x = torch.randn(T, 256, device="cuda", dtype=torch.bfloat16)
        index, routing = _routing(T, 4, 64, gen, "cuda")
        module(x, index, routing)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = module(x, index, routing)
        for seed in range(3):
            g = torch.Generator().manual_seed(100 + seed)
            new_index, new_routing = _routing(T, 4, 64, g, "cuda")
            x.copy_(torch.randn(T, 256, generator=g).cuda()), index.copy_(new_index), routing.copy_(new_routing)
            graph.replay()
            assert torch.equal(out, module(x, index, routing))
