"""Every option fla 0.6's GLAConfig accepts, on CPU, against a PyTorch reference written from fla's
code (fla/layers/gla.py, fla/modules, fla's naive recurrent GLA): fla's own model needs Triton on a
GPU (tests/test_fla_parity.py compares with it there)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_err
from transformers import AutoModelForCausalLM

import laquant
from laquant.errors import LaquantError
from laquant.loading import load_tokenizer, model_config
from laquant.models import GLAConfig, GLAForCausalLM
from laquant.recipe import load_recipe

VOCAB = 300

# fla's ACT2FN, as its code computes them
FLA_ACT = {"relu": F.relu, "sigmoid": torch.sigmoid, "logsigmoid": F.logsigmoid, "swish": F.silu, "silu": F.silu,
           "sqrelu": lambda x: F.relu(x) ** 2,
           "gelu": lambda x: x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))}


def _rms(x, weight, eps):
    x = x.double()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * weight.double() if weight is not None else x


def _fla_attention(x, sd, p, cfg):
    """fla's GatedLinearAttention.forward, in float64, the recurrence step by step."""
    B, T, _ = x.shape
    H = cfg.num_heads
    groups = H // (cfg.num_kv_heads or H)
    K, V = round(cfg.hidden_size * cfg.expand_k) // H, round(cfg.hidden_size * cfg.expand_v) // H
    q, k, v = (x @ sd[f"{p}{n}_proj.weight"].double().T for n in "qkv")
    if cfg.use_short_conv:  # ShortConvolution: causal depthwise conv, silu
        def conv(t, w):
            return F.silu(F.conv1d(t.transpose(1, 2), w.double(), padding=w.shape[-1] - 1, groups=t.shape[-1])
                          [..., :T].transpose(1, 2))
        q, k, v = (conv(t, sd[f"{p}{n}_conv1d.weight"]) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    gk = (x @ sd[f"{p}gk_proj.0.weight"].double().T) @ sd[f"{p}gk_proj.1.weight"].double().T \
        + sd[f"{p}gk_proj.1.bias"].double()
    q = q.unflatten(-1, (H, K))
    # repeat(x, '... (h d) -> ... (h g) d', g=groups)
    k, gk = (t.unflatten(-1, (-1, K)).repeat_interleave(groups, dim=-2) for t in (k, gk))
    v = v.unflatten(-1, (-1, V)).repeat_interleave(groups, dim=-2)
    gk = F.logsigmoid(gk) / 16
    if cfg.clamp_min is not None:
        gk = gk.clamp_min(cfg.clamp_min)
    if cfg.feature_map is not None:
        q, k = FLA_ACT[cfg.feature_map](q), FLA_ACT[cfg.feature_map](k)
    S = x.new_zeros(B, H, K, V)
    out = []
    for t in range(T):
        S = S * gk[:, t].exp()[..., None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * K ** -0.5, S))
    o = torch.stack(out, 1)
    weight = sd.get(f"{p}g_norm_swish_gate.weight", sd.get(f"{p}g_norm.weight"))
    o = _rms(o, weight, cfg.norm_eps).flatten(-2)
    if cfg.use_output_gate:
        o = o * F.silu(x @ sd[f"{p}g_proj.weight"].double().T)
    return o @ sd[f"{p}o_proj.weight"].double().T


def _fla_softmax_attention(x, sd, p, spec):
    """fla's Attention (fla/layers/attn.py): GQA, NeoX rotary embeddings, causal (windowed) softmax."""
    B, T, C = x.shape
    H, Hkv = spec["num_heads"], spec.get("num_kv_heads") or spec["num_heads"]
    D = C // H

    def proj(n):
        y = x @ sd[f"{p}{n}_proj.weight"].double().T
        return y + sd[f"{p}{n}_proj.bias"].double() if f"{p}{n}_proj.bias" in sd else y

    q, k, v = (proj(n).unflatten(-1, (-1, D)) for n in "qkv")
    inv_freq = 1.0 / (spec.get("rope_theta", 10000.0) ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    cos, sin = freqs.cos()[:, None].repeat(1, 1, 2), freqs.sin()[:, None].repeat(1, 1, 2)

    def rope(t):
        t1, t2 = t.chunk(2, -1)
        return t * cos + torch.cat([-t2, t1], -1) * sin

    q, k = rope(q), rope(k)
    k, v = (t.repeat_interleave(H // Hkv, dim=2) for t in (k, v))
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / D ** 0.5
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    window = spec.get("window_size") or T
    scores = scores.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
    o = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v).flatten(-2)
    return o @ sd[f"{p}o_proj.weight"].double().T


def fla_reference_logits(model, ids):
    cfg, sd = model.config, model.state_dict()
    specs = cfg.attn if isinstance(cfg.attn, list) else [cfg.attn] if cfg.attn else []
    h = sd["model.embeddings.weight"].double()[ids]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = _rms(h, sd[p + "attn_norm.weight"], cfg.norm_eps)
        spec = next((s for s in specs if i in s["layers"]), None)
        h = h + (_fla_attention(x, sd, p + "attn.", cfg) if spec is None
                 else _fla_softmax_attention(x, sd, p + "attn.", spec))
        x = _rms(h, sd[p + "mlp_norm.weight"], cfg.norm_eps)
        gate, up = (x @ sd[f"{p}mlp.{n}_proj.weight"].double().T for n in ("gate", "up"))
        h = h + (F.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].double().T
    h = _rms(h, sd["model.norm.weight"], cfg.norm_eps)
    return h @ sd["lm_head.weight"].double().T


def _model(**options):
    cfg = dict(hidden_size=96, num_hidden_layers=2, num_heads=3, vocab_size=VOCAB, initializer_range=0.1,
               bos_token_id=0, eos_token_id=0)
    model = GLAForCausalLM(GLAConfig(**{**cfg, **options})).eval()
    with torch.no_grad():  # non-trivial norms and gate biases
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if "norm" in name else 0.0))
    return model


OPTIONS = {
    "short_conv": dict(use_short_conv=True, conv_size=3),
    "no_output_gate": dict(use_output_gate=False),
    "unfused_norm": dict(fuse_norm=False),
    "no_affine": dict(elementwise_affine=False),
    "gqa_expand": dict(num_kv_heads=1, expand_k=1.0, expand_v=0.5, clamp_min=-0.1),
    **{f"feature_map_{f}": dict(feature_map=f) for f in FLA_ACT},
    "tied": dict(tie_word_embeddings=True),
    # numerically inert in fla 0.6's GLA
    "inert_flags": dict(fuse_swiglu=False, fuse_cross_entropy=False, fuse_linear_cross_entropy=True, use_l2warp=True,
                        attn_mode="fused_recurrent", use_gk=False, use_gv=True, gate_logit_normalizer=8,
                        gate_low_rank_dim=4),
    "attn_layer": dict(attn={"layers": [1], "num_heads": 2, "num_kv_heads": 1, "qkv_bias": True}),
    "attn_layers_windowed": dict(num_hidden_layers=3, attn=[{"layers": [0], "num_heads": 3, "window_size": 5,
                                                             "rope_theta": 500.0}, {"layers": [2], "num_heads": 1}]),
    "all_at_once": dict(attn={"layers": [0], "num_heads": 3, "window_size": 7},use_short_conv=True, conv_size=4, use_output_gate=False, num_kv_heads=1, feature_map="relu",
                        elementwise_affine=False, tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", OPTIONS)
@torch.no_grad()
def test_options_compute_what_fla_computes(name):
    model = _model(**OPTIONS[name])
    ids = torch.randint(0, VOCAB, (2, 37))
    reference = fla_reference_logits(model, ids)
    assert rel_err(model(input_ids=ids).logits, reference) < 1e-5
    # a prompt through the cache, then token by token: the same logits
    cache = model.new_cache()
    parts = [model(input_ids=ids[:, :19], past_key_values=cache, use_cache=True).logits]
    parts += [model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(19, 37)]
    assert rel_err(torch.cat(parts, 1), reference) < 1e-5
    assert cache.seen_tokens == 37  # counted by the last layer, whichever kind it is (generate reads it)


def test_option_names_and_tying():
    names = set(_model(use_short_conv=True, fuse_norm=False).state_dict())
    assert {"model.layers.0.attn.q_conv1d.weight", "model.layers.1.attn.v_conv1d.weight",
            "model.layers.0.attn.g_norm.weight"} <= names
    assert not any("g_norm_swish_gate" in n or "conv1d.bias" in n for n in names)
    names = set(_model(use_output_gate=False, elementwise_affine=False).state_dict())
    assert not any(".g_proj." in n or ".g_norm" in n for n in names)
    tied = _model(tie_word_embeddings=True)
    assert tied.lm_head.weight is tied.model.embeddings.weight


@pytest.mark.parametrize("options, named", [
    (dict(hidden_act="relu"), "hidden_act='relu' (supported: 'swish')"),
    (dict(feature_map="bias_gelu"), "feature_map='bias_gelu' (supported: None, 'relu'"),
    (dict(attnres_block_size=2), "attnres_block_size=2 (supported: None)"),
    (dict(attn={"layers": [5], "num_heads": 2}), "attn: attn layers must be distinct indices in [0, 2); got [5]"),
    (dict(attn={"layers": [1]}), "attn: attn specification {'layers': [1]} lacks num_heads"),
])
def test_options_fla_cannot_build_or_laquant_lacks_are_named(options, named, tmp_path):
    cfg = dict(model_type="gla", hidden_size=96, num_hidden_layers=2, num_heads=3, vocab_size=VOCAB, **options)
    with pytest.raises(LaquantError, match="options laquant's GLA path does not implement: " + _escape(named)):
        model_config(cfg, tmp_path)


def _escape(text):
    import re

    return re.escape(text)


@torch.no_grad()
def test_gla_int8_round_trip_with_options(tmp_path):
    model = _model(**OPTIONS["all_at_once"])
    ids = torch.randint(0, VOCAB, (2, 40))
    base = model(input_ids=ids).logits
    calib = torch.randint(0, VOCAB, (4, 64))
    recipe = load_recipe("gla_int8", ["softmax_attention.format=int8"])  # fla's attn layer 0 too
    result = laquant.calibrate(model, recipe, calib, progress=False)
    projections = result.decisions["projections"]
    assert "model.layers.1.attn.q_proj" in projections and not any(".g_proj" in n for n in projections)
    assert projections["model.layers.0.attn.q_proj"].role == "softmax_attention"
    assert list(result.decisions["gates"]) == ["model.layers.1.attn.gk_proj"]
    quant = model(input_ids=ids).logits
    assert rel_err(quant, base) < 0.1
    laquant.save(result, tmp_path / "q", tokenizer=load_tokenizer())
    reloaded, _ = laquant.load(tmp_path / "q")
    assert torch.equal(reloaded(input_ids=ids).logits, quant)
    assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "q").eval()(input_ids=ids).logits, quant)
