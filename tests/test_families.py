"""The family registry is the one list of supported model types: loading, adapters, recipes and
the docs read it."""

import json
import re
from pathlib import Path

import pytest
import torch

from laquant.adapters import get_adapter, install
from laquant.errors import LaquantError
from laquant.families import FAMILIES, get_family
from laquant.loading import read_supported_config
from laquant.recipe import validate_recipe


def test_every_family_names_its_recurrence_and_mixer():
    for model_type, family in FAMILIES.items():
        assert family.model_type == model_type and family.recurrence in ("gla", "delta", "kda")
        if not family.native:
            mixer = family.mixer_class
            assert family.source_class and family.mixer_attr and mixer.MODULES and mixer.PROJECTIONS
            assert (mixer.GATE is None) == (model_type == "minimax")


def test_unsupported_model_types_are_refused_naming_the_registry(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(LaquantError, match=f"model_type 'llama' is not supported; supported: {', '.join(FAMILIES)}$"):
        read_supported_config(tmp_path)
    with pytest.raises(LaquantError, match="'rwkv7' is not supported"):
        get_family("rwkv7")
    with pytest.raises(LaquantError, match=f"families.llama: unknown model_type; known: {', '.join(FAMILIES)}"):
        validate_recipe({"families": {"llama": {"state": {"format": "fp32"}}}})


def test_the_readme_lists_the_registry():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    listed = re.search(r"<!-- families -->(.*?)<!-- /families -->", readme, re.S).group(1)
    assert re.findall(r"`(\w+)`", listed) == list(FAMILIES)


def test_an_adapter_reads_the_model_and_install_changes_it():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(Qwen3NextConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=16, shared_expert_intermediate_size=16,
        layer_types=["linear_attention", "full_attention"]))
    adapter = get_adapter(model)
    assert type(model.model.layers[0].linear_attn).__name__ == "Qwen3NextGatedDeltaNet"
    assert not getattr(model, "_laquant_positions_hook", False)
    with pytest.raises(LaquantError, match=r"model.layers.0.linear_attn is still transformers' .*install"):
        adapter.mixers()
    install(model)
    install(model)  # idempotent
    assert type(model.model.layers[0].linear_attn).__name__ == "GatedDeltaNetMixer"
    assert list(get_adapter(model).mixers()) == ["model.layers.0.linear_attn"]


def test_the_bench_configs_of_the_families_build():
    """tools/family_configs.py's ~1B e2e configs are valid configs of the installed transformers, each family's
    model is about that size (built on the meta device) and laquant's mixers take its layers."""
    import importlib.util

    from laquant.eval.speed import hybrid_model, hybrid_config

    path = Path(__file__).resolve().parents[1] / "tools" / "family_configs.py"
    spec = importlib.util.spec_from_file_location("family_configs", path)
    configs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(configs)
    assert set(configs.CONFIGS) <= set(FAMILIES)
    for family, fields in configs.CONFIGS.items():
        with torch.device("meta"):
            model = hybrid_model(family, hybrid_config(family, json.loads(json.dumps(fields))))
        assert 1.0e9 < sum(p.numel() for p in model.parameters()) < 2.0e9, family
        install(model)
        assert get_adapter(model).linear_layers(), family


def test_families_build_transformers_classes_when_another_package_took_the_model_type(monkeypatch, tmp_path):
    """fla registers its own Mamba2Config / Mamba2ForCausalLM as ``mamba2`` in transformers' Auto mappings when it
    is imported (``exist_ok=True``): laquant must still build transformers' Mamba-2, whose layout its adapter knows,
    from a config, a checkpoint and an ``eval speed`` spec (found on the GPU, where ``eval speed`` imports fla)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from laquant.eval.speed import hybrid_config, hybrid_model
    from laquant.loading import empty_model

    class OtherMamba2Config(PretrainedConfig):
        model_type = "mamba2"

    class OtherMamba2ForCausalLM(PreTrainedModel):
        config_class = OtherMamba2Config

    monkeypatch.setattr(CONFIG_MAPPING, "_extra_content", dict(CONFIG_MAPPING._extra_content))
    monkeypatch.setattr(MODEL_FOR_CAUSAL_LM_MAPPING, "_extra_content", dict(MODEL_FOR_CAUSAL_LM_MAPPING._extra_content))
    AutoConfig.register("mamba2", OtherMamba2Config, exist_ok=True)
    AutoModelForCausalLM.register(OtherMamba2Config, OtherMamba2ForCausalLM, exist_ok=True)
    assert CONFIG_MAPPING["mamba2"] is OtherMamba2Config  # the situation fla makes

    family = get_family("mamba2")
    assert family.config_class() is transformers.Mamba2Config
    assert family.model_class() is transformers.Mamba2ForCausalLM
    fields = dict(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32, state_size=16,
                  n_groups=2, expand=2)
    built = empty_model({"model_type": "mamba2", **fields}, tmp_path, torch.float32)
    assert type(built).__name__ == "Mamba2ForCausalLM" and get_adapter(built).linear_layers()
    config = hybrid_config("mamba2", fields)
    assert type(config) is transformers.Mamba2Config
    assert type(hybrid_model("mamba2", config)) is transformers.Mamba2ForCausalLM


def test_a_family_missing_from_the_installed_transformers_is_named(monkeypatch):
    from transformers.models.auto import configuration_auto

    monkeypatch.delitem(configuration_auto.CONFIG_MAPPING_NAMES, "qwen3_next")
    with pytest.raises(LaquantError, match=r"transformers \S+ has no config class for 'qwen3_next': install"):
        get_family("qwen3_next").config_class()
