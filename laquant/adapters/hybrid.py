"""Adapters for transformers' hybrid models: linear-attention (or SSM) layers interleaved with
softmax attention, with dense or MoE MLPs.

Building an adapter checks the model's layout against what it expects (layer types, the mixer's
modules, the split of its fused projections) and puts laquant's mixers
(:mod:`laquant.models.hybrid_mixers`) in place of transformers' linear-attention modules, so the
state path runs on laquant's ops in the recipe's state format. Everything else stays transformers'.

Roles: ``projections`` (the mixers' and MLPs' ``nn.Linear``), ``gates`` (GDN's ``in_proj_ba``,
Mamba2's ``dt`` channels of ``in_proj``), ``mixers`` (the state and its layout),
``softmax_attention`` (q/k/v/o of the attention layers), and kept ones: ``routers`` (MoE router
and shared-expert gate), ``experts`` (3-D expert weights), ``conv``, ``decay`` (``A_log``,
``dt_bias``, ``D``, Lightning's ``slope_rate``), embeddings, norms, lm_head.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from laquant.adapters.base import Adapter, MixerInfo
from laquant.errors import LaquantError
from laquant.models.cache import state_store
from laquant.models.hybrid_mixers import GatedDeltaNetMixer, LightningMixer, Mamba2Mixer

LAYER_TYPES = ("linear_attention", "full_attention")
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _positions_from_state_store(module, args, kwargs):
    """Give each call with a cache the positions that continue the sequence. transformers' hybrids
    do not all derive them from the cache (bamba starts at 0 on every call; minimax asks a linear
    layer of its cache for the length), so laquant counts the tokens in its state store."""
    cache = kwargs.get("past_key_values")
    if cache is None or kwargs.get("position_ids") is not None:
        return None
    ids = args[0] if args else kwargs.get("input_ids")
    ref = ids if ids is not None else kwargs.get("inputs_embeds")
    store = state_store(cache)
    start = store.seen_tokens
    store.seen_tokens += ref.shape[1]
    kwargs["position_ids"] = torch.arange(start, start + ref.shape[1], device=ref.device).unsqueeze(0)
    return args, kwargs


class HybridAdapter(Adapter):
    mixer_attr = ""  # the decoder layer's attribute holding the linear mixer
    attention_attr = "self_attn"
    source_class = ""  # transformers' mixer class this adapter replaces
    mixer_class: type = nn.Module
    mixer_projections: tuple[str, ...] = ()
    decay_names: tuple[str, ...] = ()

    def __init__(self, model: nn.Module):
        super().__init__(model)
        inner = getattr(model, "model", None)
        if inner is None or not isinstance(getattr(inner, "layers", None), nn.ModuleList):
            raise LaquantError(f"{self.model_type} adapter: expected a causal LM with model.layers (a ModuleList); "
                               f"got {type(model).__name__}")
        self.layers = list(inner.layers)
        types = getattr(model.config, "layer_types", None)
        if types is None or len(types) != len(self.layers):
            raise LaquantError(f"{self.model_type} adapter: cannot resolve the layer types: config.layer_types is "
                               f"{types!r}, expected one of {LAYER_TYPES} for each of the {len(self.layers)} layers")
        for i, t in enumerate(types):
            if t not in LAYER_TYPES:
                raise LaquantError(f"{self.model_type} adapter: cannot resolve the type of model.layers.{i}: "
                                   f"config.layer_types[{i}] = {t!r}; expected one of {LAYER_TYPES}")
        self.layer_types = list(types)
        for i in self.linear_layers():
            self._install_mixer(i)
        if not getattr(model, "_laquant_positions_hook", False):
            model.register_forward_pre_hook(_positions_from_state_store, with_kwargs=True)
            model._laquant_positions_hook = True
        for i in self.attention_layers():
            attn = getattr(self.layers[i], self.attention_attr, None)
            missing = [p for p in ATTENTION_PROJECTIONS if not isinstance(getattr(attn, p, None), nn.Module)]
            if attn is None or missing:
                raise LaquantError(f"{self.model_type} adapter: model.layers.{i}.{self.attention_attr} "
                                   f"({type(attn).__name__}) is not the expected softmax attention: missing "
                                   f"{', '.join(missing)}; expected q_proj, k_proj, v_proj, o_proj")

    # layout
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    def mixer_name(self, i: int) -> str:
        return f"model.layers.{i}.{self.mixer_attr}"

    def _install_mixer(self, i: int) -> None:
        layer = self.layers[i]
        mixer = getattr(layer, self.mixer_attr, None)
        if isinstance(mixer, self.mixer_class):
            return
        name = self.mixer_name(i)
        if type(mixer).__name__ != self.source_class:
            raise LaquantError(f"{self.model_type} adapter: {name} is {type(mixer).__name__}, expected transformers' "
                               f"{self.source_class} (this transformers version lays the model out differently)")
        self.check_layout(name, mixer)
        setattr(layer, self.mixer_attr, self.mixer_class(mixer))

    def check_layout(self, name: str, mixer: nn.Module) -> None:
        """Raise naming ``name`` and the expected layout when the mixer's modules differ from it."""
        cls = self.mixer_class
        expected = [*cls.MODULES, *getattr(cls, "PARAMETERS", ()), *getattr(cls, "BUFFERS", ()), *cls.ATTRS]
        missing = [a for a in expected if not hasattr(mixer, a)]
        if missing:
            raise LaquantError(f"{self.model_type} adapter: {name} ({type(mixer).__name__}) lacks "
                               f"{', '.join(missing)}; expected attributes: {', '.join(expected)} (a transformers "
                               "version with a different layout)")
        for fused, want in self.fused_splits(mixer).items():
            got = getattr(mixer, fused).out_features
            if got != sum(want.values()):
                parts = " + ".join(f"{k} {v}" for k, v in want.items())
                raise LaquantError(f"{self.model_type} adapter: fused projection {name}.{fused} has {got} outputs; "
                                   f"its split is unknown (expected {parts} = {sum(want.values())})")

    def fused_splits(self, mixer: nn.Module) -> dict[str, dict[str, int]]:
        """Fused projection -> its parts and their widths, as the mixer splits it."""
        return {}

    def mixer(self, i: int) -> nn.Module:
        return getattr(self.layers[i], self.mixer_attr)

    # roles
    def _layer_linears(self, i: int) -> dict[str, nn.Linear]:
        """The MLP side's Linears of layer ``i`` (routers excluded)."""
        routers = set(self._routers(i))
        out = {}
        for attr in ("mlp", "feed_forward", "block_sparse_moe"):
            block = getattr(self.layers[i], attr, None)
            if block is not None:
                out.update({f"model.layers.{i}.{attr}.{n}": m for n, m in block.named_modules()
                            if isinstance(m, nn.Linear) and f"model.layers.{i}.{attr}.{n}" not in routers})
        return out

    def projections(self) -> dict[str, nn.Module]:
        out = {}
        for i in range(len(self.layers)):
            if self.layer_types[i] == "linear_attention":
                out.update({f"{self.mixer_name(i)}.{p}": getattr(self.mixer(i), p) for p in self.mixer_projections})
            out.update(self._layer_linears(i))
        return out

    def attention_projections(self) -> dict[str, nn.Module]:
        return {f"model.layers.{i}.{self.attention_attr}.{p}": getattr(getattr(self.layers[i], self.attention_attr), p)
                for i in self.attention_layers() for p in ATTENTION_PROJECTIONS}

    def gates(self) -> dict[str, nn.Module]:
        return {}

    def mixers(self) -> dict[str, MixerInfo]:
        return {self.mixer_name(i): self.mixer_info(i) for i in self.linear_layers()}

    def mixer_info(self, i: int) -> MixerInfo:
        raise NotImplementedError

    def _routers(self, i: int) -> list[str]:
        out = []
        for attr in ("mlp", "block_sparse_moe"):
            block = getattr(self.layers[i], attr, None)
            for sub in ("gate", "shared_expert_gate"):
                if block is not None and hasattr(block, "experts") and getattr(block, sub, None) is not None:
                    out.append(f"model.layers.{i}.{attr}.{sub}")
        return out

    def kept(self) -> dict[str, list[str]]:
        named = dict(self.model.named_modules())
        norms = [n for n, m in named.items() if "norm" in type(m).__name__.lower() and n]
        experts = [n for n in named if n.endswith(".experts")]
        conv = [f"{self.mixer_name(i)}.conv1d" for i in self.linear_layers() if hasattr(self.mixer(i), "conv1d")]
        decay = [f"{self.mixer_name(i)}.{p}" for i in self.linear_layers() for p in self.decay_names]
        return {"embeddings": ["model.embed_tokens"], "norms": norms, "lm_head": ["lm_head"],
                "routers": [r for i in range(len(self.layers)) for r in self._routers(i)], "experts": experts,
                "conv": conv, "decay": decay}

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    # layer-by-layer calibration runs the whole model with layers onloaded by hooks (see run.py)
    def decoder_layers(self) -> list[tuple[str, nn.Module]]:
        return [(f"model.layers.{i}", layer) for i, layer in enumerate(self.layers)]


class Qwen3NextAdapter(HybridAdapter):
    model_type = "qwen3_next"
    mixer_attr = "linear_attn"
    source_class = "Qwen3NextGatedDeltaNet"
    mixer_class = GatedDeltaNetMixer
    mixer_projections = ("in_proj_qkvz", "out_proj")
    decay_names = ("A_log", "dt_bias")

    def fused_splits(self, m):
        return {"in_proj_qkvz": {"q": m.key_dim, "k": m.key_dim, "v": m.value_dim, "z": m.value_dim},
                "in_proj_ba": {"b": m.num_v_heads, "a": m.num_v_heads}}

    def check_layout(self, name, mixer):
        super().check_layout(name, mixer)
        if mixer.num_v_heads % mixer.num_k_heads:
            raise LaquantError(f"{self.model_type} adapter: {name}: {mixer.num_v_heads} value heads do not group "
                               f"evenly over {mixer.num_k_heads} key heads; the fused split is unknown")

    def gates(self):
        return {f"{self.mixer_name(i)}.in_proj_ba": self.mixer(i).in_proj_ba for i in self.linear_layers()}

    def mixer_info(self, i):
        m = self.mixer(i)
        return MixerInfo(self.mixer_name(i), i, m.num_v_heads, m.head_k_dim, m.head_v_dim)

    def gate_log_decay(self, gate_name, logits):
        mixer = self.module(gate_name.rpartition(".")[0])
        a = mixer.split_ba(logits.to(mixer.A_log.device))[1]  # statistics live on the CPU, A_log may not
        return mixer.log_decay(a).to(logits.device)


class MiniMaxAdapter(HybridAdapter):
    model_type = "minimax"
    mixer_attr = "self_attn"
    source_class = "MiniMaxLightningAttention"
    mixer_class = LightningMixer
    mixer_projections = ("qkv_proj", "output_gate", "out_proj")
    decay_names = ("slope_rate",)

    def fused_splits(self, m):
        width = m.num_attention_heads * m.head_dim
        return {"qkv_proj": {"q": width, "k": width, "v": width}}

    def mixer_info(self, i):
        m = self.mixer(i)
        return MixerInfo(self.mixer_name(i), i, m.num_attention_heads, m.head_dim, m.head_dim)

    def new_cache(self):
        from transformers.models.minimax.modeling_minimax import MiniMaxCache

        return MiniMaxCache()  # MiniMaxModel accepts no other cache class


class BambaAdapter(HybridAdapter):
    model_type = "bamba"
    mixer_attr = "mamba"
    source_class = "BambaMixer"
    mixer_class = Mamba2Mixer
    mixer_projections = ("in_proj", "out_proj")
    decay_names = ("A_log", "dt_bias", "D")

    def fused_splits(self, m):
        return {"in_proj": {"z": m.intermediate_size, "x": m.intermediate_size,
                            "B": m.n_groups * m.ssm_state_size, "C": m.n_groups * m.ssm_state_size,
                            "dt": m.num_heads}}

    def gates(self):
        # Mamba2's gate is the dt slice of the fused in_proj (also a projection)
        return {f"{self.mixer_name(i)}.in_proj": self.mixer(i).in_proj for i in self.linear_layers()}

    def gate_channels(self, name):
        m = self.module(name.rpartition(".")[0])
        return m.intermediate_size + m.conv_dim, m.num_heads

    def mixer_info(self, i):
        m = self.mixer(i)
        return MixerInfo(self.mixer_name(i), i, m.num_heads, m.ssm_state_size, m.head_dim)

    def gate_log_decay(self, gate_name, logits):
        mixer = self.module(gate_name.rpartition(".")[0])
        return mixer.log_decay(logits.to(mixer.A_log.device)).to(logits.device)


HYBRID_ADAPTERS = {a.model_type: a for a in (Qwen3NextAdapter, MiniMaxAdapter, BambaAdapter)}


def is_hybrid(model) -> bool:
    return getattr(model.config, "model_type", None) in HYBRID_ADAPTERS


def new_cache(model):
    """A fresh cache for ``model`` (laquant's GLA or a transformers hybrid): what ``past_key_values``
    takes for incremental decoding."""
    if hasattr(model, "new_cache"):
        return model.new_cache()
    from laquant.adapters import get_adapter

    return get_adapter(model).new_cache()


__all__ = ["HYBRID_ADAPTERS", "BambaAdapter", "HybridAdapter", "MiniMaxAdapter", "Qwen3NextAdapter", "is_hybrid",
           "new_cache"]
