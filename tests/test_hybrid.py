"""transformers hybrids (qwen3_next, minimax, bamba, qwen3_5 text and vision-language, olmo_hybrid, nemotron_h,
kimi_linear, bailing_hybrid, granitemoehybrid, falcon_h1, zamba2) on tiny random configs: plumbing only.

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
from laquant.adapters import cache_kwargs, get_adapter, install, new_cache
from laquant.calibration.run import collect_stats
from laquant.cli import main
from laquant.errors import LaquantError
from laquant.families import get_family
from laquant.loading import load_tokenizer
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


# the vision tower of the vision-language wrappers: 2 blocks, its patch merger (the projector) into the text width
VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8, out_hidden_size=64,
              num_position_embeddings=64)
VL_TOKENS = dict(image_token_id=VOCAB - 2, video_token_id=VOCAB - 1, vision_start_token_id=VOCAB - 4,
                 vision_end_token_id=VOCAB - 3)


def qwen3_5_vl(**kw):
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = qwen3_5(**kw).config.to_dict()
    return Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=VISION, **VL_TOKENS))


def qwen3_5_moe_vl(**kw):
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    text = qwen3_5_moe(**kw).config.to_dict()
    return Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeConfig(text_config=text, vision_config=VISION, **VL_TOKENS))


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


def kimi_linear(**kw):
    # KDA, KDA + MoE, MLA softmax attention, KDA + MoE
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=2,
               num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
               v_head_dim=16, linear_num_heads=2, linear_head_dim=16, num_local_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=32, num_shared_experts=1,
               layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
               mlp_layer_types=["dense", "sparse", "dense", "sparse"], bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return KimiLinearForCausalLM(KimiLinearConfig(**{**cfg, **kw}))


def bailing_hybrid(**kw):
    # KDA with the bounded ("safe") gate, MLA with a head-wise output gate; dense and MoE MLPs
    import transformers

    if not hasattr(transformers, "BailingHybridConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no BailingHybrid model (5.17 has none)")
    from transformers import BailingHybridConfig, BailingHybridForCausalLM

    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=2,
               num_key_value_heads=2, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
               head_dim=16, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_group=1,
               topk_group=1, layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
               mlp_layer_types=["dense", "sparse", "dense", "sparse"], bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return BailingHybridForCausalLM(BailingHybridConfig(**{**cfg, **kw}))


def granitemoehybrid(**kw):
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    # bamba's mixer shape; MoE beside the shared MLP; every multiplier away from 1 so parity covers them
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, intermediate_size=32, num_attention_heads=2,
               num_key_value_heads=1, mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16,
               mamba_chunk_size=16, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48,
               position_embedding_type="rope", embedding_multiplier=3.0, residual_multiplier=0.5,
               attention_multiplier=0.2, logits_scaling=2.5,
               layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
               bos_token_id=0, eos_token_id=0)
    return GraniteMoeHybridForCausalLM(GraniteMoeHybridConfig(**{**cfg, **kw}))


def falcon_h1(**kw):
    from transformers import FalconH1Config, FalconH1ForCausalLM

    # every block runs Mamba2 and attention side by side; every muP multiplier away from 1
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, intermediate_size=96, num_attention_heads=2,
               num_key_value_heads=1, mamba_d_ssm=128, mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2,
               mamba_d_state=16, mamba_chunk_size=16, mamba_rms_norm=True, embedding_multiplier=2.0,
               lm_head_multiplier=0.7, mlp_multipliers=[1.3, 0.6], key_multiplier=0.8, attention_in_multiplier=1.5,
               attention_out_multiplier=0.9, ssm_multipliers=[0.5, 1.25, 0.75, 1.5, 2.0], ssm_in_multiplier=1.2,
               ssm_out_multiplier=0.8, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return FalconH1ForCausalLM(FalconH1Config(**{**cfg, **kw}))


def zamba2(**kw):
    from transformers import Zamba2Config, Zamba2ForCausalLM

    # two shared transformer blocks used by three hybrid layers (layers 1 and 4 share block 0), each
    # use with its own LoRA adapters; tied embeddings
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=6, intermediate_size=96, num_attention_heads=2,
               num_key_value_heads=2, n_mamba_heads=4, mamba_d_state=16, mamba_ngroups=2, chunk_size=16, num_mem_blocks=2,
               use_shared_attention_adapter=True, adapter_rank=8, use_mem_rope=True,
               layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid", "hybrid",
                                  "linear_attention"], bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return Zamba2ForCausalLM(Zamba2Config(**{**cfg, **kw}))


def mamba2(**kw):
    from transformers import Mamba2Config, Mamba2ForCausalLM

    # a Mamba2 language model (Mamba-2, Codestral Mamba): Mamba2 blocks alone, the decoder under `backbone`
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_heads=4, head_dim=32, state_size=16,
               n_groups=2, expand=2, chunk_size=16, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return Mamba2ForCausalLM(Mamba2Config(**{**cfg, **kw}))


FAMILIES = {"qwen3_next": qwen3_next, "minimax": minimax, "bamba": bamba, "qwen3_5": qwen3_5,
            "qwen3_5_moe": qwen3_5_moe, "qwen3_5_vl": qwen3_5_vl, "qwen3_5_moe_vl": qwen3_5_moe_vl,
            "olmo_hybrid": olmo_hybrid, "nemotron_h": nemotron_h,
            "kimi_linear": kimi_linear, "bailing_hybrid": bailing_hybrid,
            "granitemoehybrid": granitemoehybrid, "falcon_h1": falcon_h1, "zamba2": zamba2, "mamba2": mamba2}


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
    kw = cache_kwargs(model, cache)  # Mamba2's forward takes `cache` alone
    parts = [model(input_ids=ids[:, :split], **kw, use_cache=True).logits]
    parts += [model(input_ids=ids[:, t:t + 1], **kw, use_cache=True).logits
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


@pytest.mark.parametrize("options", [dict(mamba_rms_norm=False), dict(mamba_norm_before_gate=False)])
@torch.no_grad()
def test_falcon_h1_mixer_options(options):
    """Falcon-H1's optional gated norm: without it y * silu(z); with it, the gate before the norm."""
    torch.manual_seed(5)
    model = falcon_h1(**options).float().eval()
    ids = torch.randint(0, VOCAB, (2, 37))
    reference = model(input_ids=ids).logits
    install(model)
    assert rel_err(model(input_ids=ids).logits, reference) < 1e-5
    assert _prefill_vs_decode(model, ids, 21)[0] < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_roles(family):
    adapter = install(_model(family))
    kept = adapter.kept()
    if family.endswith("_vl"):  # the language model's roles, under its path; the vision tower kept whole
        assert kept["vision"] == ["model.visual"] and kept["embeddings"] == ["model.language_model.embed_tokens"]
        roles = [*adapter.projections(), *adapter.attention_projections(), *adapter.gates(), *adapter.mixers(),
                 *kept["norms"], *kept["decay"]]
        assert all(n.startswith("model.language_model.layers.") or n == "model.language_model.norm" for n in roles)
        assert adapter.mixer_name(0) == "model.language_model.layers.0.linear_attn"
        assert list(adapter.gates()) == [f"model.language_model.layers.{i}.linear_attn.in_proj_a" for i in range(3)]
        assert len(adapter.attention_projections()) == 4 and adapter.attention_layers() == [3]
        return
    if family == "mamba2":  # Mamba2 blocks alone under `backbone`: in_proj (its dt channels the gate), out_proj
        assert kept["embeddings"] == ["backbone.embeddings"] and "backbone.norm_f" in kept["norms"]
        assert not adapter.attention_layers() and not adapter.attention_projections()
        assert sorted(adapter.projections()) == sorted(f"backbone.layers.{i}.mixer.{p}" for i in range(3)
                                                       for p in ("in_proj", "out_proj"))
        assert list(adapter.gates()) == [f"backbone.layers.{i}.mixer.in_proj" for i in range(3)]
        assert adapter.mixer_name(0) == "backbone.layers.0.mixer"
        return
    embeddings = "model.embeddings" if family == "nemotron_h" else "model.embed_tokens"  # the module that exists
    assert kept["decay"] and kept["norms"] and kept["embeddings"] == [embeddings]
    assert isinstance(adapter.model.get_submodule(embeddings), nn.Embedding)
    mla = family in ("kimi_linear", "bailing_hybrid")  # their softmax attention is MLA
    attention = (".q_proj", ".kv_a_proj_with_mqa", ".kv_b_proj", ".o_proj") if mla else (
        ".q_proj", ".k_proj", ".v_proj", ".o_proj")
    assert all(n.endswith(attention) for n in adapter.attention_projections())
    # zamba2: the shared block's projections once, under their first use
    shared = {"zamba2": 1}.get(family, 0)
    assert len(adapter.attention_projections()) == 4 * (len(adapter.attention_layers()) - shared) > 0
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
    elif family == "kimi_linear":  # the gate is the per-channel decay's f_b_proj; its low-rank input a projection
        assert {f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "forget_gate.f_a_proj",
                                                           "b_proj", "g_a_proj", "g_b_proj", "o_proj")} <= set(projections)
        assert list(adapter.gates()) == [f"model.layers.{i}.self_attn.forget_gate.f_b_proj" for i in (0, 1, 3)]
        assert {"model.layers.0.self_attn.forget_gate.A_log", "model.layers.0.self_attn.forget_gate.dt_bias"} <= set(
            kept["decay"])
        assert "model.layers.1.mlp.gate" in kept["routers"] and "model.layers.1.mlp.experts" in kept["experts"]
        assert "model.layers.1.mlp.shared_experts.up_proj" in projections
        assert (info.num_heads, info.head_k, info.head_v) == (2, 16, 16)
        assert adapter.linear_layers() == [0, 1, 3] and adapter.attention_layers() == [2]
    elif family == "bailing_hybrid":  # a full-rank gate; MLA's head-wise output gate stays out of the roles
        assert {f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "b_proj", "g_proj",
                                                           "o_proj")} <= set(projections)
        assert list(adapter.gates()) == [f"model.layers.{i}.self_attn.forget_gate.f_proj" for i in (0, 1, 3)]
        assert "model.layers.2.self_attn.g_proj" not in {**projections, **adapter.attention_projections()}
        assert (info.num_heads, info.head_k, info.head_v) == (2, 16, 16)
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
    if family == "falcon_h1":  # every block: Mamba2 beside attention, then the MLP
        assert adapter.linear_layers() == adapter.attention_layers() == [0, 1, 2]
        assert {"model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.o_proj"} <= set(
            adapter.attention_projections())
        assert {"model.layers.1.feed_forward.gate_proj", "model.layers.1.feed_forward.down_proj"} <= set(projections)
        mixer = adapter.mixer(0)  # the gate's log-decay: the raw dt logits times their muP multiplier (2.0)
        logits = torch.randn(5, 4)
        assert torch.allclose(mixer.gate_log_decay(logits), mixer.log_decay(2.0 * logits))
    if family == "zamba2":  # Mamba2 everywhere; hybrid layers nest it beside a shared transformer block
        assert adapter.linear_layers() == list(range(6)) and adapter.attention_layers() == [1, 3, 4]
        assert adapter.mixer_name(3) == "model.layers.3.mamba_decoder.mamba" and "model.layers.3.mamba_decoder.mamba" \
            in adapter.mixers()
        assert "model.layers.4.mamba_decoder.mamba.in_proj" in adapter.gates()
        assert set(adapter.attention_projections()) == {f"model.layers.{i}.shared_transformer.self_attn.{p}"
                                                        for i in (1, 3) for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
        assert {"model.layers.1.shared_transformer.feed_forward.gate_up_proj", "model.layers.4.linear",
                "model.layers.1.shared_transformer.feed_forward.gate_up_proj_adapter_list.2.0",
                "model.layers.1.shared_transformer.self_attn.linear_q_adapter_list.0.1"} <= set(projections)
        assert not any(n.startswith("model.layers.4.shared_transformer") for n in projections)
    if family == "granitemoehybrid":  # the MoE's router is a bare parameter, kept; the shared MLP is quantized
        assert adapter.linear_layers() == [0, 1, 3] and adapter.attention_layers() == [2]
        assert {"model.layers.2.shared_mlp.input_linear", "model.layers.2.shared_mlp.output_linear"} <= set(projections)
        assert "model.layers.0.block_sparse_moe.router" in kept["routers"]
        assert "model.layers.0.block_sparse_moe.experts" in kept["experts"]


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
    assert roles == ({None} if family == "mamba2" else {None, "softmax_attention"})  # Mamba2 LMs have no attention
    assert len(d["state"]) == len(get_adapter(model).linear_layers())
    assert bool(d["gates"]) == (family != "minimax")  # minimax's family default keeps its (absent) gates
    assert result.recipe["families"] == {} and all(v["format"] == "int8_row" and v.get("rounding") == "stochastic"
                                                 for v in d["state"].values())
    quant = model(input_ids=ids).logits
    assert rel_err(quant, base) < 0.05
    # 8-bit state: decode stores it after every token, prefill every 64: close, not equal (bailing_hybrid's
    # bounded gate decays fast, so each token's rounding weighs more: 0.056 measured, 0.015 with a bf16 state)
    err, cache = _prefill_vs_decode(model, ids, 40)
    assert err < (0.08 if family == "bailing_hybrid" else 0.05)
    assert all(s.data.dtype == torch.int8 for s in state_store(cache).states.values())

    out = tmp_path / "q"
    laquant.save(result, out, tokenizer=tok)
    reloaded, _ = laquant.load(out)
    assert torch.equal(reloaded(input_ids=ids).logits, quant)
    auto = get_family(model.config.model_type).model_class()  # AutoModelForImageTextToText for a VL model
    hf = auto.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf) is type(model) and torch.equal(hf(input_ids=ids).logits, quant)
    if family.endswith("_vl"):  # the vision tower as it came, byte for byte
        assert _same_bytes(_vision_tensors(out), _vision_tensors(model_dir))


@torch.no_grad()
def test_zamba2_shared_blocks_are_quantized_once_and_stored_once(tmp_path):
    """A shared transformer block used at several depths is one module: calibrated on all its uses,
    quantized once, stored once, and one module again after laquant.load and from_pretrained."""
    from safetensors import safe_open

    model = _model("zamba2")
    adapter = install(model)
    layers = model.model.layers
    assert layers[4].shared_transformer is layers[1].shared_transformer
    assert layers[3].shared_transformer is not layers[1].shared_transformer  # the other block (num_mem_blocks 2)
    assert not any(k.startswith("model.layers.4.shared_transformer") for k in model.state_dict())
    # the statistics of the shared q_proj are those of both its uses (layers 1 and 4)
    seen = []
    q = layers[1].shared_transformer.self_attn.q_proj
    handle = q.register_forward_hook(lambda m, args, out: seen.append(args[0].detach().abs().amax((0, 1))))
    calib = torch.randint(0, VOCAB, (2, 48))
    stats = collect_stats(model, adapter, calib, segment=48, batch_size=2, progress=False)
    handle.remove()
    assert len(seen) == 2 and not torch.equal(seen[0], seen[1])
    name = "model.layers.1.shared_transformer.self_attn.q_proj"
    assert torch.equal(stats.get(name, "act_absmax"), torch.maximum(*seen))

    ids = torch.randint(0, VOCAB, (1, 33))
    result = laquant.calibrate(model, "hybrid_int8", calib, progress=False)
    quant = model(input_ids=ids).logits
    assert type(layers[4].shared_transformer.self_attn.q_proj).__name__ == "QuantLinear"
    assert not any(".layers.4.shared_transformer" in n for n in result.decisions["projections"])
    laquant.save(result, tmp_path / "q", tokenizer=load_tokenizer())
    with safe_open(str(tmp_path / "q" / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert f"{name}.qweight" in keys and not any(k.startswith("model.layers.4.shared_transformer") for k in keys)
    assert "lm_head.weight" not in keys  # tied to the embeddings: stored once too
    for reloaded in (laquant.load(tmp_path / "q")[0], AutoModelForCausalLM.from_pretrained(tmp_path / "q").eval()):
        shared = reloaded.model.layers
        assert shared[4].shared_transformer is shared[1].shared_transformer
        assert torch.equal(reloaded(input_ids=ids).logits, quant)


def test_a_block_tied_in_part_is_refused():
    model = _model("zamba2")
    block = model.model.layers[4].shared_transformer
    block.self_attn.q_proj.weight = nn.Parameter(block.self_attn.q_proj.weight.detach().clone())
    with pytest.raises(LaquantError, match=r"model.layers.4.shared_transformer shares some but not all of its weights "
                                           r"with model.layers.1.shared_transformer"):
        install(model)


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


def test_an_unsupported_model_type_is_refused_naming_the_supported_ones():
    from laquant.families import get_family

    with pytest.raises(LaquantError, match=r"'mystery' is not supported; supported: gla, qwen3_next.*qwen3_5, "):
        get_family("mystery")


def _vision_tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k.startswith("model.visual.")}


def _same_bytes(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8),
                                                                                  b[k].view(torch.uint8)) for k in a)


@torch.no_grad()
def test_a_vision_language_model_quantizes_its_language_model_alone(tmp_path, capsys):
    """``laquant calibrate`` on a saved Qwen3.5 VL model: text-only calibration, the language model
    quantized, the vision tower (its merger, the projector, within) stored byte for byte as it came."""
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    from laquant.loading import default_model_dir

    src = tmp_path / "vl"
    _model("qwen3_5_vl").to(torch.bfloat16).save_pretrained(src)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir() / name, src / name)
    out = tmp_path / "q"
    assert main(["calibrate", "--recipe", "hybrid_int8", "--model", str(src), "--samples", "2", "--seq-len", "64",
                 "--no-eval", "--out", str(out), "--quiet"]) == 0
    vision = _vision_tensors(src)
    assert len(vision) > 20 and all(t.dtype == torch.bfloat16 for t in vision.values())
    assert _same_bytes(_vision_tensors(out), vision)
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv.qweight" in keys
    assert "model.language_model.layers.3.self_attn.q_proj.qweight" in keys
    decisions = checkpoint_decisions(out)
    assert decisions["projections"] and not any("visual" in n for part in decisions.values() for n in part)
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModelForImageTextToText"]
    ids = torch.randint(0, VOCAB - 8, (1, 21))
    model, _ = laquant.load(out)
    hf = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__.endswith("ForConditionalGeneration")
    assert torch.equal(hf(input_ids=ids).logits, model(input_ids=ids).logits)
    for m in (model, hf):  # the vision tower: not quantized, the checkpoint's numbers
        assert not any(type(x).__module__.startswith("laquant") for x in m.model.visual.modules())
        assert all(torch.equal(p.to(torch.bfloat16), vision[f"model.visual.{n}"])
                   for n, p in m.model.visual.named_parameters())
    # the compressed-tensors export: transformers' vision-language class loads it (compressed-tensors' W8A8 in the
    # language model), the vision tower as the checkpoint holds it and every one of its linears in `ignore`
    pytest.importorskip("compressed_tensors")
    ct = tmp_path / "ct"
    assert main(["export", str(out), "--format", "compressed-tensors", "--out", str(ct), "--quiet"]) == 0
    config = json.loads((ct / "config.json").read_text())
    assert config["architectures"] == [type(hf).__name__]
    ignore = set(config["quantization_config"]["ignore"])
    vision_linears = {n for n, m in hf.named_modules() if n.startswith("model.visual") and
                      isinstance(m, torch.nn.Linear)}
    assert vision_linears and vision_linears <= ignore
    assert "model.language_model.layers.3.self_attn.q_proj" not in ignore  # W8A8 int8
    assert _same_bytes(_vision_tensors(ct), vision)
    serving = (ct / "serving.md").read_text()
    assert "AutoModelForImageTextToText" in serving
    ppl = {row.split("|")[1].strip(): float(row.split("|")[2].split()[0]) for row in serving.splitlines()
           if row.startswith("| laquant") or row.startswith("| compressed-tensors export")}
    assert len(ppl) == 2 and abs(ppl["compressed-tensors export"] / ppl["laquant (hybrid_int8)"] - 1) < 0.02, ppl
    served = AutoModelForImageTextToText.from_pretrained(ct, dtype=torch.float32).eval()
    with torch.no_grad():
        base = AutoModelForImageTextToText.from_pretrained(src, dtype=torch.float32).eval()(input_ids=ids).logits
        laquant_logits = model(input_ids=ids).logits
        err = rel_err(served(input_ids=ids).logits, laquant_logits)
    assert 0 < err < 2 * rel_err(laquant_logits, base) + 2e-3  # compressed-tensors' activation grid: see its tests


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

    model = _model("granitemoehybrid")  # an attention layer where config.layer_types says mamba
    model.model.layers[1].mamba = model.model.layers[2].self_attn
    with pytest.raises(LaquantError, match="model.layers.1.mamba is GraniteMoeHybridAttention, expected transformers' "
                                           "GraniteMoeHybridMambaLayer"):
        get_adapter(model)

    model = _model("falcon_h1")  # a version without the muP vector on the mixer
    del model.model.layers[1].mamba.mup_vector
    with pytest.raises(LaquantError, match=r"model.layers.1.mamba: mup_vector is None, expected one multiplier per "
                                           r"in_proj output \(324\)"):
        get_adapter(model)

    model = _model("zamba2")  # a hybrid layer without its nested Mamba2 layer
    del model.model.layers[3].mamba_decoder
    with pytest.raises(LaquantError, match="model.layers.3.mamba_decoder.mamba is NoneType, expected transformers' "
                                           "Zamba2MambaMixer"):
        get_adapter(model)

    model = _model("minimax")
    model.model.layers[1].self_attn.q_proj = None
    with pytest.raises(LaquantError, match=r"model.layers.1.self_attn .* missing q_proj"):
        get_adapter(model)


def test_kimi_linear_layouts_are_named_and_mla_with_a_low_rank_q_is_taken():
    model = _model("kimi_linear")
    del model.model.layers[1].self_attn.forget_gate.dt_bias
    with pytest.raises(LaquantError, match=r"model.layers.1.self_attn: forget_gate \(KimiLinearForgetGate\) lacks "
                                           r"dt_bias"):
        get_adapter(model)
    model = _model("kimi_linear")
    model.model.layers[0].self_attn.forget_gate.f_b_proj = nn.Linear(16, 16, bias=False)  # a per-head decay
    with pytest.raises(LaquantError, match=r"forget_gate.f_b_proj has 16 outputs, expected 32"):
        get_adapter(model)
    model = _model("kimi_linear")
    model.model.layers[2].self_attn.kv_b_proj = None
    with pytest.raises(LaquantError, match=r"model.layers.2.self_attn .* missing kv_b_proj"):
        get_adapter(model)
    torch.manual_seed(3)
    adapter = install(kimi_linear(q_lora_rank=8).float().eval())  # MLA's q through q_a_proj -> q_b_proj
    assert [n.rpartition(".")[2] for n in adapter.attention_projections()] == ["q_a_proj", "q_b_proj",
                                                                               "kv_a_proj_with_mqa", "kv_b_proj",
                                                                               "o_proj"]


@torch.no_grad()
def test_bailing_hybrid_without_the_safe_gate():
    """The unbounded gate ``-exp(A_log) softplus(x + dt_bias)``: still transformers' numbers."""
    torch.manual_seed(3)
    model = bailing_hybrid(kda_safe_gate=False).float().eval()
    ids = torch.randint(0, VOCAB, (2, 21))
    reference = model(input_ids=ids).logits
    install(model)
    assert rel_err(model(input_ids=ids).logits, reference) < 1e-5
    assert _prefill_vs_decode(model, ids, 13)[0] < 1e-5


@torch.no_grad()
def test_kimi_linear_gate_log_decay_is_transformers_forget_gate():
    model = _model("kimi_linear")
    gate = model.model.layers[0].self_attn.forget_gate
    x = torch.randn(2, 5, 64)
    expected = gate(x)  # transformers' [B, T, H, K]
    adapter = install(model)
    name = "model.layers.0.self_attn.forget_gate.f_b_proj"
    logits = adapter.module(name)(adapter.module("model.layers.0.self_attn.forget_gate.f_a_proj")(x))
    assert rel_err(adapter.gate_log_decay(name, logits), expected.flatten(-2)) < 1e-5  # softplus: log1p vs log(1 + x)


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
@pytest.mark.parametrize("family", ["qwen3_next", "minimax", "bamba", "kimi_linear", "mamba2", "nemotron_h"])
@pytest.mark.parametrize("recipe", [None, "gla_fp8_state"])
@torch.no_grad()
def test_hybrid_state_paths_on_the_triton_kernels(family, recipe, monkeypatch):
    """On CUDA the state paths run on laquant's Triton kernels: Gated DeltaNet on the delta-rule
    kernels, KDA on its per-channel form, Lightning and Mamba2 on the GLA kernels (scalar decay; Mamba2's decode
    step in their SSD mode, its float32 prefill's products on the tensor cores); they match the references."""
    import laquant.kernels.delta.chunk as delta_chunk
    import laquant.kernels.delta.decode as delta_decode
    import laquant.kernels.gla.chunk as gla_chunk
    import laquant.kernels.gla.decode as gla_decode
    import laquant.kernels.kda.chunk as kda_chunk
    import laquant.kernels.kda.decode as kda_decode

    model = _model(family).cuda()
    install(model)
    if recipe is not None:
        laquant.calibrate(model, recipe, torch.randint(0, VOCAB, (4, 128)).cuda(), progress=False)
    ids = torch.randint(0, VOCAB, (3, 150)).cuda()
    called, fp32_dots = set(), set()
    for module, name in ((delta_chunk, "chunk_delta_triton"), (delta_decode, "delta_decode_step"),
                         (gla_chunk, "chunk_gla_triton"), (gla_decode, "gla_decode_step"),
                         (gla_decode, "ssd_decode_step"),
                         (kda_chunk, "chunk_kda_triton"), (kda_decode, "kda_decode_step")):
        def spy(*args, _fn=getattr(module, name), _name=name, **kwargs):
            called.add(_name)
            if "fp32_dots" in kwargs:
                fp32_dots.add(kwargs["fp32_dots"])
            return _fn(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)

    def run():
        full = model(input_ids=ids).logits
        err, cache = _prefill_vs_decode(model, ids, 100)
        return full, err

    fast, fast_err = run()
    mamba2 = family in ("bamba", "mamba2", "nemotron_h")
    expected = {"qwen3_next": {"chunk_delta_triton", "delta_decode_step"},
                "kimi_linear": {"chunk_kda_triton", "kda_decode_step"},
                }.get(family, {"chunk_gla_triton", "ssd_decode_step" if mamba2 else "gla_decode_step"})
    assert called == expected
    assert fp32_dots == ({"tf32x3"} if mamba2 else {"ieee"} if "chunk_gla_triton" in called else set())
    monkeypatch.setenv("LAQUANT_KERNELS", "reference")
    slow, slow_err = run()
    # 8-bit state: the kernels scale by a reciprocal multiply, the reference divides (a code may differ)
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


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_a_multi_token_continuation_through_the_cache_equals_one_prefill(family):
    """Calibration runs its windows in segments through the cache: a segment after the first must
    attend to every cached key. (transformers 5.24's MiniMaxCache sized the causal mask from layer 0, a
    linear layer holding no keys: the continuation saw only itself, 0.02 off.)"""
    model = _model(family)
    install(model)
    ids = torch.randint(0, VOCAB, (2, 45))
    full = model(input_ids=ids).logits
    cache = new_cache(model)
    kw = cache_kwargs(model, cache)
    parts = [model(input_ids=ids[:, :16], **kw, use_cache=True).logits,
             model(input_ids=ids[:, 16:33], **kw, use_cache=True).logits,
             model(input_ids=ids[:, 33:], **kw, use_cache=True).logits]
    assert rel_err(torch.cat(parts, 1), full) < 1e-5


@pytest.mark.parametrize("family", ["nemotron_h", "minimax"])
@torch.no_grad()
def test_the_cache_concatenates_contiguous_keys(family, monkeypatch):
    """A quantized model's k and v are column slices of one fused GEMM's output; laquant's caches copy a strided
    slice to a contiguous tensor before transformers concatenates it (its strided cat kernel is unvectorized over
    the whole cached length on the GPU). The cached values are the same."""
    model = _model(family)
    install(model)
    cache = new_cache(model)
    layer = 2 if family == "nemotron_h" else 1  # a softmax-attention layer (the test model's layer types)
    fused = torch.randn(2, 4, 3, 5, 8)  # [B, H, T, parts, D]: k and v strided slices of one tensor
    k, v = fused[..., 0, :], fused[..., 1, :]
    assert not k.is_contiguous()
    seen = []
    cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda xs, *a, **kw: seen.append([x.is_contiguous() for x in xs]) or cat(xs, *a, **kw))
    keys, values = cache.update(k, v, layer)
    assert seen and all(all(flags) for flags in seen), seen
    assert torch.equal(keys, k) and torch.equal(values, v)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5", "kimi_linear", "nemotron_h", "granitemoehybrid"])
def test_eval_speed_spec_builds_a_random_hybrid_of_each_family(family):
    """``laquant eval speed --model FAMILY:{json}``: the spec names a family, its JSON the config's fields, and
    the e2e suite builds transformers' model of it (laquant's mixers go in after); bad JSON or fields are named."""
    import json

    from laquant.errors import LaquantError
    from laquant.eval.speed import hybrid_model, _parse_spec, hybrid_config

    src = _model(family)
    kind = src.config.model_type
    fields = {k: v for k, v in src.config.to_dict().items()
              if k not in ("architectures", "transformers_version", "dtype", "model_type")}
    parsed_kind, parsed = _parse_spec(f"{kind}:{json.dumps(fields)}")
    assert parsed_kind == kind and parsed == json.loads(json.dumps(fields))
    model = hybrid_model(kind, hybrid_config(kind, parsed))
    assert type(model) is type(src) and model.config.hidden_size == src.config.hidden_size
    assert install(model) is not None and sum(p.numel() for p in model.parameters()) > 0
    with pytest.raises(LaquantError, match="not JSON"):
        _parse_spec(f"{kind}:{{oops")
    if kind != "qwen3_next":
        with pytest.raises(LaquantError, match=f"not a valid {kind} config"):
            hybrid_config(kind, {"hidden_size": "wide", "num_hidden_layers": -1})


@pytest.mark.parametrize("family", ["bamba", "nemotron_h", "granitemoehybrid", "zamba2"])
@torch.no_grad()
def test_mamba2_in_proj_treats_its_dt_channels_alone(family, monkeypatch):
    """A calibrated Mamba2 in_proj (a QuantGate of its dt channels) runs its linears and treats the dt channels
    alone, without its forward's copy of the whole output: the same logits, prefill and decode, bit for bit."""
    from laquant.models.hybrid_mixers import Mamba2Mixer
    from laquant.quant.modules import QuantGate

    model = _model(family)
    install(model)
    laquant.calibrate(model, "hybrid_int8", torch.randint(0, VOCAB, (2, 32)), progress=False)
    mixers = [m for m in model.modules() if isinstance(m, Mamba2Mixer)]
    assert mixers and all(isinstance(m.in_proj, QuantGate) for m in mixers)
    ids = torch.randint(0, VOCAB, (2, 9))
    calls = []
    untreated = QuantGate.untreated
    monkeypatch.setattr(QuantGate, "untreated", lambda self, x: calls.append(1) or untreated(self, x))

    def prefill_and_step():
        out = model(ids[:, :8], past_key_values=new_cache(model), use_cache=True)
        return out.logits, model(ids[:, 8:], past_key_values=out.past_key_values, use_cache=True).logits

    fast = prefill_and_step()
    assert len(calls) == 2 * len(mixers)
    handles = [m.in_proj.register_forward_hook(lambda *args: None) for m in mixers]  # hooked: the module's forward
    calls.clear()
    slow = prefill_and_step()
    assert not calls
    for handle in handles:
        handle.remove()
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))


def _without_layer_types(config, monkeypatch):
    if isinstance(getattr(type(config), "layer_types", None), property):  # derived from other fields
        monkeypatch.setattr(type(config), "layer_types", None)
    else:
        config.layer_types = None


def test_a_mamba2_config_without_layer_types_is_all_linear(monkeypatch):
    """transformers' Mamba2Config lists no layer_types in some releases (the H200's 5.17 build): every block is
    then a linear mixer, installed and run as with the list; another family without them still fails loudly."""
    torch.manual_seed(0)
    model = FAMILIES["mamba2"]().eval()
    ids = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        want = model(ids).logits
    _without_layer_types(model.config, monkeypatch)
    assert getattr(model.config, "layer_types", None) is None
    adapter = install(model)
    assert adapter.layer_types == ["linear_attention"] * 3
    with torch.no_grad():
        assert rel_err(model(ids).logits, want) < 1e-5
    other = FAMILIES["qwen3_next"]()
    _without_layer_types(other.config, monkeypatch)
    with pytest.raises(LaquantError, match="cannot resolve the layer types"):
        install(other)


def test_the_cache_keyword_of_each_transformers_release():
    """A forward taking ``cache`` (transformers >= 5.24), ``cache_params`` (its Mamba-2 models before) or only
    ``past_key_values``: laquant passes its cache by the keyword there is and finds it in the output and in a layer's
    call (the H200's transformers 5.17 Mamba-2 model ignored a ``past_key_values`` and decoded without a cache)."""
    from laquant.adapters import _cache_keyword, returned_cache
    from laquant.models.cache import passed_cache

    class New(nn.Module):
        def forward(self, input_ids, cache=None, past_key_values=None, **kwargs): ...

    class OldMamba2(nn.Module):
        def forward(self, input_ids, cache_params=None, **kwargs): ...

    class Old(nn.Module):
        def forward(self, input_ids, past_key_values=None, **kwargs): ...

    assert [_cache_keyword(c) for c in (New, OldMamba2, Old)] == ["cache", "cache_params", "past_key_values"]
    cache = object()
    for name in ("cache", "cache_params", "past_key_values"):
        assert returned_cache({name: cache}) is cache
        assert passed_cache({"input_ids": 1, name: cache}) is cache
    assert passed_cache({"cache": None, "past_key_values": cache}) is cache
    assert passed_cache({}) is None
