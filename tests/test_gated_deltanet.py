"""fla's native Gated DeltaNet (``model_type: gated_deltanet``) and DeltaNet (``delta_net``) on laquant's
implementation, without fla: against a float64 reference written from fla's code
(fla/layers/gated_deltanet.py, fla/layers/delta_net.py, fla/ops/gated_delta_rule/naive.py,
fla/ops/delta_rule/naive.py), cache and decode, and the hybrid_int8 round trip."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_err
from test_gla_options import _fla_softmax_attention, _rms
from transformers import AutoModelForCausalLM

import laquant
from laquant.adapters import get_adapter
from laquant.errors import LaquantError
from laquant.loading import load_tokenizer, model_config
from laquant.models import DeltaNetConfig, DeltaNetForCausalLM, GatedDeltaNetConfig, GatedDeltaNetForCausalLM
from laquant.models.cache import state_store
from laquant.recipe import load_recipe

VOCAB = 300


def _l2norm(t):
    return t / (t.square().sum(-1, keepdim=True) + 1e-6).sqrt()  # fla's l2norm


def _naive_delta_rule(q, k, v, g, beta):
    """fla's naive recurrent (gated) delta rule, q and k already normalised: ``o [B, T, H, V]``."""
    B, T, H, K = q.shape
    h = q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for t in range(T):
        h = h * g[:, t].exp()[..., None, None]
        b_v = (v[:, t] - (h * k[:, t, ..., None]).sum(-2)) * beta[:, t, :, None]
        h = h + k[:, t, ..., None] * b_v[..., None, :]
        out.append(((q[:, t] * K ** -0.5)[..., None] * h).sum(-2))
    return torch.stack(out, 1)


def _fla_delta_net(x, sd, p, cfg):
    B, T, _ = x.shape
    H = cfg.num_heads
    K, V = int(cfg.hidden_size * cfg.expand_k) // H, int(cfg.hidden_size * cfg.expand_v) // H
    silu_qk = cfg.qk_activation == "silu"
    q, k, v = (x @ sd[f"{p}{n}_proj.weight"].double().T for n in "qkv")
    if cfg.use_short_conv:  # fla's ShortConvolution: silu on q and k only with qk_activation silu
        def conv(t, w, act):
            y = F.conv1d(t.transpose(1, 2), w.double(), padding=w.shape[-1] - 1, groups=t.shape[-1])[..., :T]
            return F.silu(y.transpose(1, 2)) if act else y.transpose(1, 2)
        q, k = (conv(t, sd[f"{p}{n}_conv1d.weight"], silu_qk) for t, n in ((q, "q"), (k, "k")))
        v = conv(v, sd[f"{p}v_conv1d.weight"], True)
    else:
        q, k = (F.silu(q), F.silu(k)) if silu_qk else (q, k)
        v = F.silu(v)
    q, k, v = q.unflatten(-1, (H, K)), k.unflatten(-1, (H, K)), v.unflatten(-1, (H, V))
    act = {"relu": F.relu, "elu": lambda t: F.elu(t, 1.0) + 1.0, "identity": lambda t: t}.get(cfg.qk_activation)
    if act is not None:
        q, k = act(q), act(k)
    q, k = (_l2norm(q), _l2norm(k)) if cfg.qk_norm == "l2" else (q / q.sum(-1, keepdim=True), k / k.sum(-1, keepdim=True))
    beta = (x @ sd[f"{p}b_proj.weight"].double().T).sigmoid() if cfg.use_beta else x.new_ones(B, T, H)
    o = _rms(_naive_delta_rule(q, k, v, x.new_zeros(B, T, H), beta), sd[f"{p}o_norm.weight"], cfg.norm_eps)
    if cfg.use_gate:
        o = o * F.silu((x @ sd[f"{p}g_proj.weight"].double().T).unflatten(-1, (H, V)))
    return o.flatten(-2) @ sd[f"{p}o_proj.weight"].double().T


def _fla_gated_deltanet(x, sd, p, cfg):
    B, T, _ = x.shape
    H, Hv = cfg.num_heads, cfg.num_v_heads or cfg.num_heads
    K, V = cfg.head_dim, int(cfg.head_dim * cfg.expand_v)
    q, k, v = (x @ sd[f"{p}{n}_proj.weight"].double().T for n in "qkv")
    if cfg.use_short_conv:
        def conv(t, w):
            return F.silu(F.conv1d(t.transpose(1, 2), w.double(), padding=w.shape[-1] - 1, groups=t.shape[-1])
                          [..., :T].transpose(1, 2))
        q, k, v = (conv(t, sd[f"{p}{n}_conv1d.weight"]) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    else:
        q, k, v = F.silu(q), F.silu(k), F.silu(v)
    # the kernels' use_qk_l2norm_in_kernel, value heads grouped over the q/k heads
    q, k = (_l2norm(t).repeat_interleave(Hv // H, dim=2) for t in (q.unflatten(-1, (H, K)), k.unflatten(-1, (H, K))))
    v = v.unflatten(-1, (Hv, V))
    g = -sd[f"{p}A_log"].double().exp() * F.softplus(x @ sd[f"{p}a_proj.weight"].double().T + sd[f"{p}dt_bias"].double())
    beta = (x @ sd[f"{p}b_proj.weight"].double().T).sigmoid() * (2.0 if cfg.allow_neg_eigval else 1.0)
    o = _rms(_naive_delta_rule(q, k, v, g, beta), sd[f"{p}o_norm.weight"], cfg.norm_eps)
    if cfg.use_gate:
        gate = (x @ sd[f"{p}g_proj.weight"].double().T).unflatten(-1, (Hv, V))
        o = o * (gate.sigmoid() if cfg.output_gate_activation == "sigmoid" else F.silu(gate))
    return o.flatten(-2) @ sd[f"{p}o_proj.weight"].double().T


def fla_reference_logits(model, ids):
    cfg, sd = model.config, model.state_dict()
    specs = cfg.attn if isinstance(cfg.attn, list) else [cfg.attn] if cfg.attn else []
    h = sd["model.embeddings.weight"].double()[ids]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = _rms(h, sd[p + "attn_norm.weight"], cfg.norm_eps)
        spec = next((s for s in specs if i in s["layers"]), None)
        mixer = _fla_delta_net if cfg.model_type == "delta_net" else _fla_gated_deltanet
        h = h + (mixer(x, sd, p + "attn.", cfg) if spec is None else _fla_softmax_attention(x, sd, p + "attn.", spec))
        x = _rms(h, sd[p + "mlp_norm.weight"], cfg.norm_eps)
        gate, up = (x @ sd[f"{p}mlp.{n}_proj.weight"].double().T for n in ("gate", "up"))
        h = h + (F.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].double().T
    return _rms(h, sd["model.norm.weight"], cfg.norm_eps) @ sd["lm_head.weight"].double().T


def _model(delta_net: bool = False, **options):
    if delta_net:  # fla's DeltaNet: widths from hidden_size * expand_k / expand_v
        cfg = dict(hidden_size=64, num_heads=2, expand_k=0.5, expand_v=0.75, num_hidden_layers=2, vocab_size=VOCAB,
                   initializer_range=0.1, bos_token_id=0, eos_token_id=0)
        model = DeltaNetForCausalLM(DeltaNetConfig(**{**cfg, **options})).eval()
    else:
        cfg = dict(hidden_size=64, head_dim=16, num_heads=2, expand_v=1.5, num_hidden_layers=2, vocab_size=VOCAB,
                   initializer_range=0.1, bos_token_id=0, eos_token_id=0)
        model = GatedDeltaNetForCausalLM(GatedDeltaNetConfig(**{**cfg, **options})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    return model


OPTIONS = {
    "default": {},
    "grouped_value_heads": dict(num_v_heads=4),
    "no_gate": dict(use_gate=False),
    "no_short_conv": dict(use_short_conv=False),
    "sigmoid_gate_neg_eigval": dict(output_gate_activation="sigmoid", allow_neg_eigval=True),
    "attn_layer_tied": dict(attn={"layers": [0], "num_heads": 2, "num_kv_heads": 1}, tie_word_embeddings=True),
    "inert_flags": dict(fuse_norm=False, fuse_swiglu=False, attn_mode="fused_recurrent", use_l2warp=True),
}


# fla's DeltaNet (delta_net=True)
DELTA_NET_OPTIONS = {
    "delta_net": dict(delta_net=True),
    "delta_net_gate_no_beta": dict(delta_net=True, use_gate=True, use_beta=False),
    "delta_net_elu_sum_norm": dict(delta_net=True, qk_activation="elu", qk_norm="sum"),
    "delta_net_identity_no_conv": dict(delta_net=True, qk_activation="identity", use_short_conv=False),
    "delta_net_relu_attn_tied": dict(delta_net=True, qk_activation="relu", tie_word_embeddings=True,
                                     attn={"layers": [1], "num_heads": 2, "num_kv_heads": 1}),
}


@pytest.mark.parametrize("name", [*OPTIONS, *DELTA_NET_OPTIONS])
@torch.no_grad()
def test_gated_deltanet_computes_what_fla_computes(name):
    model = _model(**{**OPTIONS, **DELTA_NET_OPTIONS}[name])
    ids = torch.randint(0, VOCAB, (2, 29))
    reference = fla_reference_logits(model, ids)
    assert rel_err(model(input_ids=ids).logits, reference) < 1e-5
    cache = model.new_cache()
    parts = [model(input_ids=ids[:, :15], past_key_values=cache, use_cache=True).logits]
    parts += [model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(15, 29)]
    assert rel_err(torch.cat(parts, 1), reference) < 1e-5
    assert cache.seen_tokens == 29


def test_unsupported_options_are_named(tmp_path):
    cfg = dict(model_type="gated_deltanet", hidden_size=64, head_dim=16, num_heads=2, num_hidden_layers=2,
               output_gate_activation="gelu", attnres_block_size=2)
    with pytest.raises(LaquantError, match=r"options laquant does not implement: attnres_block_size=2 .*"
                                           r"output_gate_activation='gelu' \(supported: swish, silu, sigmoid\)"):
        model_config(cfg, tmp_path)


def test_unsupported_delta_net_options_are_named(tmp_path):
    cfg = dict(model_type="delta_net", hidden_size=64, num_heads=3, num_hidden_layers=2, qk_norm="layer",
               qk_activation="gelu")
    with pytest.raises(LaquantError, match=r"delta_net config uses options laquant does not implement: "
                                           r"qk_activation='gelu' .*qk_norm='layer' .*expand_k=1.0 \(hidden_size \* "
                                           r"expand_k = 64 does not split into 3 heads\)"):
        model_config(cfg, tmp_path)


@torch.no_grad()
def test_delta_net_checkpoint_loads_and_hybrid_int8_round_trips(tmp_path):
    """No gate projection, no decay parameters: hybrid_int8's delta_net default keeps the (absent) gates."""
    model = _model(delta_net=True, use_gate=True, attn={"layers": [1], "num_heads": 2})
    model.save_pretrained(tmp_path / "fla")
    load_tokenizer().save_pretrained(tmp_path / "fla")
    loaded, tok = laquant.load_model(tmp_path / "fla")
    ids = torch.randint(0, VOCAB, (2, 40))
    base = loaded(input_ids=ids).logits
    assert torch.equal(base, model(input_ids=ids).logits)
    adapter = get_adapter(loaded)
    assert adapter.gates() == {} and adapter.kept()["decay"] == []
    assert {f"model.layers.0.attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "b_proj", "g_proj", "o_proj")} == {
        n for n in adapter.projections() if ".attn." in n}
    info = adapter.mixers()["model.layers.0.attn"]
    assert (info.num_heads, info.head_k, info.head_v) == (2, 16, 24)
    result = laquant.calibrate(loaded, "hybrid_int8", torch.randint(0, VOCAB, (4, 80)), progress=False)
    assert not result.decisions["gates"] and list(result.decisions["state"]) == ["model.layers.0.attn"]
    quant = loaded(input_ids=ids).logits
    assert rel_err(quant, base) < 0.05
    laquant.save(result, tmp_path / "q", tokenizer=tok)
    assert torch.equal(laquant.load(tmp_path / "q")[0](input_ids=ids).logits, quant)
    assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "q").eval()(input_ids=ids).logits, quant)


@torch.no_grad()
def test_fla_checkpoint_loads_and_hybrid_int8_round_trips(tmp_path):
    model = _model(num_v_heads=4, attn={"layers": [1], "num_heads": 2})
    model.save_pretrained(tmp_path / "fla")  # fla's names and config fields
    load_tokenizer().save_pretrained(tmp_path / "fla")
    loaded, tok = laquant.load_model(tmp_path / "fla")
    ids = torch.randint(0, VOCAB, (2, 40))
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)

    adapter = get_adapter(loaded)
    assert list(adapter.gates()) == ["model.layers.0.attn.a_proj"]
    assert list(adapter.mixers()) == ["model.layers.0.attn"] and adapter.mixers()["model.layers.0.attn"].num_heads == 4
    assert set(adapter.attention_projections()) == {f"model.layers.1.attn.{p}" for p in ("q_proj", "k_proj", "v_proj",
                                                                                         "o_proj")}
    assert "model.layers.0.attn.A_log" in adapter.kept()["decay"]
    base = loaded(input_ids=ids).logits
    result = laquant.calibrate(loaded, "hybrid_int8", torch.randint(0, VOCAB, (4, 80)), progress=False)
    assert result.decisions["projections"]["model.layers.1.attn.q_proj"].role == "softmax_attention"
    quant = loaded(input_ids=ids).logits
    assert rel_err(quant, base) < 0.05
    laquant.save(result, tmp_path / "q", tokenizer=tok)
    assert torch.equal(laquant.load(tmp_path / "q")[0](input_ids=ids).logits, quant)
    assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "q").eval()(input_ids=ids).logits, quant)

    # prefill equals decode with the state stored in bf16
    bf16 = laquant.load_model(tmp_path / "fla")[0]
    laquant.calibrate(bf16, load_recipe("hybrid_int8", ["state.format=bf16", "state.rounding=nearest"]), torch.randint(0, VOCAB, (2, 64)),
                      progress=False)
    full = bf16(input_ids=ids).logits
    cache = bf16.new_cache()
    steps = [bf16(input_ids=ids[:, :23], past_key_values=cache, use_cache=True).logits]
    steps += [bf16(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(23, 40)]
    # decode rounds the state to bf16 after every token, prefill once at its end: close, not equal
    assert rel_err(torch.cat(steps, 1), full) < 0.05
    assert state_store(cache).states[0].data.dtype == torch.bfloat16
