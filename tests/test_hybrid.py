"""transformers hybrids (qwen3_next, minimax, bamba, qwen3_5, olmo_hybrid, nemotron_h) on tiny random configs: plumbing only.

The adapters' models must compute what transformers computes, carry their state through laquant's
cache, quantize by role, save and reload bit for bit, and refuse layouts they do not know.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn as nn
from conftest import checkpoint_decisions, rel_err, same_tensors
from transformers import (AutoModelForCausalLM, BambaConfig, BambaForCausalLM, MiniMaxConfig, MiniMaxForCausalLM,
                          NemotronHConfig, NemotronHForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM)

import laquant
from laquant.adapters import get_adapter, install, new_cache
from laquant.calibration.run import collect_stats
from laquant.cli import main
from laquant.errors import LaquantError
from laquant.models.cache import state_store
from laquant.recipe import load_recipe

VOCAB = 8192  # the shipped tokenizer's


def qwen3_next(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=2,
               num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
               linear_key_head_dim=16, linear_value_head_dim=24, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=2,
               layer_types=["linear_attention"] * 3 + ["full_attention"], bos_token_id=0, eos_token_id=0)
    return Qwen3NextForCausalLM(Qwen3NextConfig(**{**cfg, **kw}))


def minimax(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=2,
               num_key_value_heads=1, head_dim=32, num_local_experts=4, num_experts_per_tok=2, block_size=16,
               layer_types=["linear_attention", "full_attention"] * 2, bos_token_id=0, eos_token_id=0)
    return MiniMaxForCausalLM(MiniMaxConfig(**{**cfg, **kw}))


def bamba(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=2,
               num_key_value_heads=1, mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16,
               mamba_chunk_size=16, attn_layer_indices=[2], bos_token_id=0, eos_token_id=0)
    return BambaForCausalLM(BambaConfig(**{**cfg, **kw}))


def qwen3_5(**kw):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=2,
               num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
               linear_key_head_dim=16, linear_value_head_dim=24,
               layer_types=["linear_attention"] * 3 + ["full_attention"], bos_token_id=0, eos_token_id=0)
    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{**cfg, **kw}))


def qwen3_5_moe(**kw):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
               num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
               linear_key_head_dim=16, linear_value_head_dim=24, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=32, shared_expert_intermediate_size=32,
               layer_types=["linear_attention"] * 3 + ["full_attention"], bos_token_id=0, eos_token_id=0)
    return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**{**cfg, **kw}))


def olmo_hybrid(**kw):
    from transformers import OlmoHybridConfig, OlmoHybridForCausalLM

    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=2,
               num_key_value_heads=1, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
               linear_value_head_dim=24, linear_allow_neg_eigval=True,
               layer_types=["linear_attention"] * 3 + ["full_attention"], bos_token_id=0, eos_token_id=0,
               pad_token_id=0)
    return OlmoHybridForCausalLM(OlmoHybridConfig(**{**cfg, **kw}))


def nemotron_h(**kw):
    # typed blocks: mamba, MoE, attention, MLP, mamba (the grouped gated RMSNorm: n_groups 2)
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1,
               head_dim=32, mamba_num_heads=4, mamba_head_dim=32, n_groups=2, ssm_state_size=16, chunk_size=16,
               n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               moe_shared_expert_intermediate_size=32, n_group=1, topk_group=1, use_mamba_kernels=False,
               layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "linear_attention"],
               bos_token_id=0, eos_token_id=0)
    return NemotronHForCausalLM(NemotronHConfig(**{**cfg, **kw}))


FAMILIES = {"qwen3_next": qwen3_next, "minimax": minimax, "bamba": bamba, "qwen3_5": qwen3_5,
            "qwen3_5_moe": qwen3_5_moe, "olmo_hybrid": olmo_hybrid, "nemotron_h": nemotron_h}


def _model(family):
    torch.manual_seed(3)
    return FAMILIES[family]().float().eval()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_dir(request, tmp_path_factory):
    from laquant.loading import default_model_dir

    out = tmp_path_factory.mktemp(request.param)
    _model(request.param).to(torch.bfloat16).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir() / name, out / name)
    return request.param, out


def _prefill_vs_decode(model, ids, split):
    full = model(input_ids=ids).logits
    cache = new_cache(model)
    parts = [model(input_ids=ids[:, :split], past_key_values=cache, use_cache=True).logits]
    parts += [model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
              for t in range(split, ids.shape[1])]
    return rel_err(torch.cat(parts, 1), full), cache


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_laquant_mixers_compute_what_transformers_does(family):
    model = _model(family)
    ids = torch.randint(0, VOCAB, (2, 45))
    reference = model(input_ids=ids).logits  # transformers' own PyTorch path
    adapter = install(model)
    mixer_types = {type(adapter.module(n)).__name__ for n in adapter.mixers()}
    assert mixer_types == {adapter.mixer_class.__name__}
    assert rel_err(model(input_ids=ids).logits, reference) < 1e-5
    # a prompt, then token by token, through the cache: the same logits
    err, cache = _prefill_vs_decode(model, ids, 29)
    assert err < 1e-5
    assert sorted(state_store(cache).states) == adapter.linear_layers()


@pytest.mark.parametrize("family", FAMILIES)
def test_roles(family):
    adapter = install(_model(family))
    kept = adapter.kept()
    assert kept["decay"] and kept["norms"] and kept["embeddings"] == ["model.embed_tokens"]
    assert all(n.endswith((".q_proj", ".k_proj", ".v_proj", ".o_proj")) for n in adapter.attention_projections())
    assert len(adapter.attention_projections()) == 4 * len(adapter.attention_layers()) > 0
    projections = adapter.projections()
    assert not set(projections) & set(adapter.attention_projections())
    assert not set(projections) & set(kept["routers"])
    assert all(isinstance(m, nn.Linear) for m in projections.values())
    info = next(iter(adapter.mixers().values()))
    if family == "qwen3_next":
        assert "model.layers.0.linear_attn.in_proj_qkvz" in projections
        assert list(adapter.gates()) == [f"model.layers.{i}.linear_attn.in_proj_ba" for i in range(3)]
        assert "model.layers.1.mlp.gate" in kept["routers"] and "model.layers.1.mlp.experts" in kept["experts"]
        assert (info.num_heads, info.head_k, info.head_v) == (2, 16, 24)
    elif family == "olmo_hybrid":
        assert {f"model.layers.0.linear_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "b_proj", "g_proj",
                                                             "o_proj")} <= set(projections)
        assert list(adapter.gates()) == [f"model.layers.{i}.linear_attn.a_proj" for i in range(3)]
        assert "model.layers.0.linear_attn.A_log" in kept["decay"]
        assert (info.num_heads, info.head_k, info.head_v) == (2, 16, 24)
    elif family in ("qwen3_5", "qwen3_5_moe"):  # separate projections: the gate is in_proj_a
        assert {f"model.layers.0.linear_attn.{p}" for p in ("in_proj_qkv", "in_proj_z", "in_proj_b")} <= set(projections)
        assert list(adapter.gates()) == [f"model.layers.{i}.linear_attn.in_proj_a" for i in range(3)]
        assert "model.layers.0.linear_attn.A_log" in kept["decay"]
        assert (info.num_heads, info.head_k, info.head_v) == (2, 16, 24)
    elif family == "minimax":
        assert adapter.gates() == {} and "model.layers.0.self_attn.slope_rate" in kept["decay"]
        assert (info.num_heads, info.head_k, info.head_v) == (2, 32, 32)
    else:
        gate = f"model.layers.0.{adapter.mixer_attr}.in_proj"
        assert gate in adapter.gates() and gate in projections
        assert adapter.gate_channels(gate) == (64 * 2 + 64 * 2 + 2 * 2 * 16, 4)
        assert (info.num_heads, info.head_k, info.head_v) == (4, 16, 32)  # [d_state, head_dim]
    if family == "nemotron_h":  # typed blocks: mamba, MoE, attention, MLP, mamba, each at .mixer
        assert adapter.linear_layers() == [0, 4] and adapter.attention_layers() == [2]
        assert "model.layers.2.mixer.q_proj" in adapter.attention_projections()
        assert {"model.layers.3.mixer.up_proj", "model.layers.3.mixer.down_proj",
                "model.layers.1.mixer.shared_experts.up_proj"} <= set(projections)
        assert "model.layers.1.mixer.gate" in kept["routers"] and "model.layers.1.mixer.experts" in kept["experts"]


@torch.no_grad()
def test_laquant_ops_replace_the_fla_route(monkeypatch):
    """With fla installed, transformers sends qwen3_next's delta rule to fla's GPU kernels even on a
    CPU; laquant's mixers never call transformers' (or fla's) delta-rule functions."""
    from transformers.models.qwen3_next import modeling_qwen3_next

    def gpu_only(*args, **kwargs):
        raise RuntimeError("fla kernel called on a CPU tensor")

    for fn in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        monkeypatch.setattr(modeling_qwen3_next, fn, gpu_only)
    model = _model("qwen3_next")
    ids = torch.randint(0, VOCAB, (1, 20))
    with pytest.raises(RuntimeError, match="fla kernel"):
        model(input_ids=ids)
    install(model)
    assert torch.isfinite(model(input_ids=ids).logits).all()


@torch.no_grad()
def test_hybrid_int8_calibrate_export_reload(family_dir, tmp_path):
    family, model_dir = family_dir
    model, tok = laquant.load_model(model_dir)
    ids = torch.randint(0, VOCAB, (2, 70))
    base = model(input_ids=ids).logits
    calib = torch.randint(0, VOCAB, (4, 96))
    result = laquant.calibrate(model, "hybrid_int8", calib, progress=False)
    d = result.decisions
    roles = {dd.get("role") for dd in d["projections"].values()}
    assert roles == {None, "softmax_attention"} and len(d["state"]) == len(get_adapter(model).linear_layers())
    assert bool(d["gates"]) == (family != "minimax")  # minimax's family default keeps its (absent) gates
    assert result.recipe["families"] == {} and all(v["format"] == "fp8_row" for v in d["state"].values())
    quant = model(input_ids=ids).logits
    assert rel_err(quant, base) < 0.05
    # fp8 state: decode stores it after every token, prefill every 64: close, not equal
    err, cache = _prefill_vs_decode(model, ids, 40)
    assert err < 0.05
    assert all(s.data.dtype == torch.float8_e4m3fn for s in state_store(cache).states.values())

    out = tmp_path / "q"
    laquant.save(result, out, tokenizer=tok)
    reloaded, _ = laquant.load(out)
    assert torch.equal(reloaded(input_ids=ids).logits, quant)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert torch.equal(hf(input_ids=ids).logits, quant)


def test_calibrate_cli_on_a_hybrid(family_dir, tmp_path, capsys):
    family, model_dir = family_dir
    if family != "qwen3_next":
        pytest.skip("one family is enough for the CLI path")
    out = tmp_path / "q"
    assert main(["calibrate", "--recipe", "hybrid_int8", "--model", str(model_dir), "--samples", "2",
                 "--seq-len", "64", "--eval-max-tokens", "300", "--eval-context", "64", "--out", str(out),
                 "--quiet"]) == 0
    assert "| hybrid_int8 |" in capsys.readouterr().out
    report = (out / "report.md").read_text()
    assert "in_proj_ba" in report and "linear_attn" in report
    assert main(["calibrate", "--recipe", "hybrid_int8", "--model", str(model_dir), "--samples", "2",
                 "--seq-len", "64", "--no-eval", "--offload", "--out", str(tmp_path / "off"), "--quiet"]) == 0
    # layer by layer quantizes exactly as the whole model did (same samples and seed)
    assert checkpoint_decisions(tmp_path / "off") == checkpoint_decisions(out)
    for name in ("model.safetensors", "stats.safetensors"):
        assert same_tensors(tmp_path / "off" / name, out / name), name
    # a config transformers refuses: one line naming the field, exit 2, nothing written
    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["layer_types"][1] = "mystery"
    (bad / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert main(["calibrate", "--recipe", "hybrid_int8", "--model", str(bad), "--out", str(tmp_path / "b"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "config.json is not a valid qwen3_next config" in err and "layer_types" in err and "'mystery'" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "b").exists()


@torch.no_grad()
def test_layer_by_layer_calibration_of_a_hybrid_equals_whole_model():
    model = _model("qwen3_next")
    adapter = install(model)
    batches = torch.randint(0, VOCAB, (3, 80))
    whole = collect_stats(model, adapter, batches, segment=32, batch_size=2, progress=False)
    layerwise = collect_stats(model, adapter, batches, segment=32, batch_size=2, progress=False,
                              layerwise_device="cpu")
    assert whole.tensors.keys() == layerwise.tensors.keys()
    for key, value in whole.tensors.items():
        assert torch.equal(value, layerwise.tensors[key]), key


def test_a_vision_language_qwen3_5_is_refused_with_what_to_do():
    from laquant.families import get_family

    with pytest.raises(LaquantError, match=r"model_type 'qwen3_5' is not supported \(a vision-language checkpoint.*"
                                           r"'qwen3_5_text'.*; supported: gla, .*qwen3_5_text"):
        get_family("qwen3_5")
    with pytest.raises(LaquantError, match=r"'mystery' is not supported; supported: gla, qwen3_next"):
        get_family("mystery")


def test_unresolvable_layer_types_are_named():
    model = _model("qwen3_next")
    model.config.layer_types = ["linear_attention", "mystery", "linear_attention", "full_attention"]
    with pytest.raises(LaquantError, match=r"cannot resolve the type of model.layers.1: .*'mystery'"):
        get_adapter(model)
    model.config.layer_types = None
    with pytest.raises(LaquantError, match="cannot resolve the layer types"):
        get_adapter(model)


def test_unknown_module_layouts_are_named():
    model = _model("qwen3_next")
    del model.model.layers[0].linear_attn.in_proj_ba  # e.g. a version that splits it into in_proj_b, in_proj_a
    with pytest.raises(LaquantError, match=r"model.layers.0.linear_attn \(Qwen3NextGatedDeltaNet\) lacks "
                                           r"in_proj_ba; expected attributes: conv1d, in_proj_qkvz, in_proj_ba"):
        get_adapter(model)

    model = _model("qwen3_next")
    model.model.layers[1].linear_attn.in_proj_qkvz = nn.Linear(64, 100, bias=False)
    with pytest.raises(LaquantError, match=r"fused projection model.layers.1.linear_attn.in_proj_qkvz has 100 "
                                           r"outputs; its split is unknown \(expected q 16 \+ k 16 \+ v 48 \+ z 48"):
        get_adapter(model)

    model = _model("qwen3_5")
    del model.model.layers[0].linear_attn.in_proj_a  # e.g. a version that fuses b and a again
    with pytest.raises(LaquantError, match=r"model.layers.0.linear_attn \(Qwen3_5GatedDeltaNet\) lacks in_proj_a; "
                                           r"expected attributes: conv1d, in_proj_qkv, in_proj_z, in_proj_b, in_proj_a"):
        get_adapter(model)
    model = _model("qwen3_5")
    model.model.layers[1].linear_attn.in_proj_qkv = nn.Linear(64, 100, bias=False)
    with pytest.raises(LaquantError, match=r"in_proj_qkv has 100 outputs; its split is unknown \(expected q 16 \+ k 16 "
                                           r"\+ v 48"):
        get_adapter(model)
    model = _model("qwen3_5")
    model.model.layers[2].linear_attn.in_proj_a = nn.Linear(64, 3, bias=False)
    with pytest.raises(LaquantError, match=r"in_proj_a has 3 outputs, expected 2"):
        get_adapter(model)

    model = _model("bamba")
    model.model.layers[0].mamba = nn.Identity()
    with pytest.raises(LaquantError, match="model.layers.0.mamba is Identity, expected transformers' BambaMixer"):
        get_adapter(model)

    model = _model("nemotron_h")  # typed blocks: a mamba block holding an MLP, an unknown block type
    model.model.layers[4].mixer = model.model.layers[3].mixer
    with pytest.raises(LaquantError, match="model.layers.4.mixer is NemotronHMLP, expected transformers' "
                                           "NemotronHMamba2Mixer"):
        get_adapter(model)
    model.config.layer_types[4] = "mamba3"
    with pytest.raises(LaquantError, match=r"model.layers.4: config.layer_types\[4\] = 'mamba3'; expected one of "
                                           r"\('linear_attention', 'full_attention', 'mlp', 'moe'\)"):
        get_adapter(model)

    model = _model("nemotron_h")
    model.model.layers[0].mixer.in_proj = nn.Linear(64, 100, bias=False)  # e.g. without the dt channels
    with pytest.raises(LaquantError, match=r"model.layers.0.mixer.in_proj has 100 outputs; its split is unknown "
                                           r"\(expected z 128 \+ x 128 \+ B 32 \+ C 32 \+ dt 4 = 324\)"):
        get_adapter(model)

    model = _model("minimax")
    model.model.layers[1].self_attn.q_proj = None
    with pytest.raises(LaquantError, match=r"model.layers.1.self_attn .* missing q_proj"):
        get_adapter(model)


def test_a_recipe_for_a_role_the_model_lacks_is_an_error(tiny_model_dir):
    calib = torch.randint(0, VOCAB, (2, 64))
    with pytest.raises(LaquantError, match="quantizes gates, but this minimax model has no gate projections"):
        laquant.calibrate(_model("minimax"), "gla_int8", calib, progress=False)
    # an explicit --set beats the family default that keeps minimax's gates
    recipe = load_recipe("hybrid_int8", ["gates.format=int8"])
    with pytest.raises(LaquantError, match="--set gates.format=keep"):
        laquant.calibrate(_model("minimax"), recipe, calib, progress=False)
    gla, _ = laquant.load_model(tiny_model_dir)
    with pytest.raises(LaquantError, match="quantizes softmax_attention, but this gla model has no softmax-attention"):
        laquant.calibrate(gla, "hybrid_attention_w8a8", calib, progress=False)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_next", "minimax", "bamba"])
@pytest.mark.parametrize("recipe", [None, "gla_fp8_state"])
@torch.no_grad()
def test_hybrid_state_paths_on_the_triton_kernels(family, recipe, monkeypatch):
    """On CUDA the state paths run on laquant's Triton kernels: Gated DeltaNet on the delta-rule
    kernels, Lightning and Mamba2 on the GLA kernels (scalar decay); they match the references."""
    import laquant.kernels.delta.chunk as delta_chunk
    import laquant.kernels.delta.decode as delta_decode
    import laquant.kernels.gla.chunk as gla_chunk
    import laquant.kernels.gla.decode as gla_decode

    model = _model(family).cuda()
    install(model)
    if recipe is not None:
        laquant.calibrate(model, recipe, torch.randint(0, VOCAB, (4, 128)).cuda(), progress=False)
    ids = torch.randint(0, VOCAB, (3, 150)).cuda()
    called = set()
    for module, name in ((delta_chunk, "chunk_delta_triton"), (delta_decode, "delta_decode_step"),
                         (gla_chunk, "chunk_gla_triton"), (gla_decode, "gla_decode_step")):
        def spy(*args, _fn=getattr(module, name), _name=name, **kwargs):
            called.add(_name)
            return _fn(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)

    def run():
        full = model(input_ids=ids).logits
        err, cache = _prefill_vs_decode(model, ids, 100)
        return full, err

    fast, fast_err = run()
    expected = {"chunk_delta_triton", "delta_decode_step"} if family == "qwen3_next" else {"chunk_gla_triton",
                                                                                          "gla_decode_step"}
    assert called == expected
    monkeypatch.setenv("LAQUANT_KERNELS", "reference")
    slow, slow_err = run()
    # fp8 state: the kernels scale by a reciprocal multiply, the reference divides (a code may differ)
    assert rel_err(fast, slow) < (1e-4 if recipe is None else 1e-2)
    assert fast_err < (1e-4 if recipe is None else 0.05) and slow_err < (1e-4 if recipe is None else 0.05)


@pytest.mark.gpu
def test_training_on_cuda_takes_the_differentiable_path():
    """The kernels are forward-only: with gradients wanted, the mixers run the PyTorch references."""
    model = _model("qwen3_next").cuda().train()
    install(model)
    ids = torch.randint(0, VOCAB, (2, 80)).cuda()
    model(input_ids=ids, labels=ids).loss.backward()
    mixer = next(m for m in model.modules() if type(m).__name__ == "GatedDeltaNetMixer")
    grad = mixer.in_proj_qkvz.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
