"""laquant.models.quantizing_rowwise: transformers' norms that write the int8 codes of the W8A8 projections
after them (handed over with their output, laquant.quant.fused.CodesHandoff), the MLPs whose SwiGLU writes
down_proj's, and the gated norm that writes out_proj's codes in qwen3_next's mixer."""

import copy

import pytest
import torch
from test_hybrid import VOCAB, _model

from laquant.adapters import install
from laquant.models import quantizing_rowwise
from laquant.models.quantizing_rowwise import GATED_NORMS


def _norms(model):
    return [m for name, m in model.named_modules() if name.endswith(("input_layernorm", "post_attention_layernorm"))]


@torch.no_grad()
def test_install_points_each_norm_at_the_projections_after_it():
    model = _model("qwen3_next").eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, VOCAB, (2, 9))
    install(model)
    norms = _norms(model)
    assert norms and all(isinstance(n, quantizing_rowwise._QuantizingNorm) for n in norms)
    assert type(norms[0]).__name__ == "Qwen3NextRMSNorm"  # the class keeps its name (repr, hub kernels)
    layers = model.model.layers
    for layer in layers:
        owner, names = layer.input_layernorm.__dict__["_laquant_consumers"][0]
        want = ("in_proj_qkvz",) if hasattr(layer, "linear_attn") else ("q_proj", "k_proj", "v_proj")
        assert names == want and owner is (layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn)
        owner, names = layer.post_attention_layernorm.__dict__["_laquant_consumers"][0]
        assert names == ("gate_proj", "up_proj") and owner in (layer.mlp, getattr(layer.mlp, "shared_expert", None))
    mlps = [m for m in model.modules() if isinstance(m, quantizing_rowwise._QuantizingSwiGLU)]
    assert len(mlps) == len(layers)  # the dense MLPs and the MoE layers' shared experts
    assert all(type(m).__name__ == "Qwen3NextMLP" for m in mlps)
    assert sorted(model.state_dict()) == sorted(before)  # parameters keep their names
    assert quantizing_rowwise.install(layers) == len(norms) + len(mlps)  # idempotent: no second mixin
    assert type(norms[0]).__mro__[2] is norms[0]._laquant_base
    # on the CPU (and wherever the projections are not W8A8 on the GPU) the forward is transformers' own
    x = torch.randn(3, 5, 64)
    base = norms[0]._laquant_base
    assert torch.equal(norms[0](x), base.forward(norms[0], x))
    assert torch.equal(mlps[0](x), mlps[0]._laquant_base.forward(mlps[0], x))
    twin = copy.deepcopy(model)  # a copy's norms point at the copy's projections
    assert twin.model.layers[0].input_layernorm.__dict__["_laquant_consumers"][0][0] is twin.model.layers[0].linear_attn


def test_other_families_keep_their_norms():
    model = _model("nemotron_h")
    install(model)
    assert not any(isinstance(m, quantizing_rowwise._QuantizingNorm) for m in model.modules())


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_codes_handed_over_match_the_unfused_path(monkeypatch):
    """hybrid_int8 on qwen3_next, bf16 on the kernels: with the norms writing the codes (and the MLPs' SwiGLU
    down_proj's, the mixer's gated norm out_proj's), the logits match the path that quantizes each projection's input on its own
    (the norms' float32 formula, rounded once), with fewer quantization launches; graphed greedy decoding
    still equals the eager loop's."""
    import laquant
    from laquant.generate import generate

    torch.manual_seed(0)
    model = _model("qwen3_next").to("cuda", torch.bfloat16).eval()
    install(model)
    laquant.calibrate(model, "hybrid_int8", torch.randint(0, VOCAB, (2, 128), device="cuda"), progress=False)
    ids = torch.randint(0, VOCAB, (3, 37), device="cuda")

    def run():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            logits = model(ids).logits.float()
            torch.cuda.synchronize()
        return logits, sum(e.count for e in prof.key_averages() if "quantize_rows" in e.key)

    fused, fused_quantize = run()
    assert torch.isfinite(fused).all()
    assert torch.equal(generate(model, ids[:, :9], 12), generate(model, ids[:, :9], 12, graphed=False))
    for module in model.modules():
        if isinstance(module, (quantizing_rowwise._QuantizingNorm, quantizing_rowwise._QuantizingSwiGLU)):
            monkeypatch.setattr(module, "__class__", module._laquant_base)
    monkeypatch.delitem(GATED_NORMS, "Qwen3NextRMSNormGated")
    plain, plain_quantize = run()
    assert fused_quantize < plain_quantize, (fused_quantize, plain_quantize)
    assert (fused - plain).abs().max() <= 0.05 * plain.abs().max(), float((fused - plain).abs().max())
