"""The family registry: every model type laquant supports, in one table.

A :class:`Family` says how to build a model of that type (laquant's own implementation, or
transformers' through its Auto classes), which adapter maps its roles, and for transformers'
hybrids where the linear mixer sits, which transformers class that is and which of laquant's
mixers replaces it (the mixer class carries its recurrence and layout). Loading, adapters, recipes
(``families:`` keys) and the supported list in errors and docs all read :data:`FAMILIES`.

Adding a transformers hybrid whose recurrence laquant has is one entry here (plus its tests).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from laquant.errors import LaquantError


# the names of the projections that close a block (attention's and a linear mixer's output projection, an MLP's down
# projection, Granite 4's shared MLP's output_linear), in every family: recipe field projections.output_act_granularity
OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "down_proj", "output_linear")


@dataclass(frozen=True)
class LayerPaths:
    """Where a layer type's parts sit in its decoder layer, as dotted attribute paths, for layouts
    that differ by type (zamba2's hybrid layers nest the mixer and the attention): the linear mixer,
    the softmax attention ("" when none) and the blocks whose other Linears are projections."""

    mixer: str
    attention: str = ""
    linears: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    model_type: str
    recurrence: str  # "gla" (gated linear attention, incl. Lightning and Mamba2's SSD), "delta" (gated delta rule)
    # or "kda" (the delta rule with a per-channel decay)
    # transformers' hybrids: the decoder layer's attribute holding the linear mixer, transformers'
    # class found there, and laquant's mixer class (laquant.models.hybrid_mixers) that replaces it
    mixer_attr: str = ""
    source_class: str = ""
    mixer: str = ""
    cache: Callable | None = None  # a fresh cache for incremental decoding, where transformers' default does not fit
    # the graphed decode steps' static cache where the model takes no cache class but its own (minimax's
    # MiniMaxCache): a subclass of laquant.models.static_hybrid.StaticHybridCache and of that class (`stands_for`)
    static_cache: Callable | None = None
    # where the softmax attention sits, and config.layer_types' MLP-only block types (nemotron_h types
    # each block: its mixer_attr holds the linear mixer, the attention or the MLP / MoE)
    attention_attr: str = "self_attn"
    mlp_layer_types: tuple[str, ...] = ()
    # the softmax attention's projections, and those of them a config may leave None (MLA's q_proj
    # or its low-rank q_a_proj / q_b_proj, by q_lora_rank)
    attention_projections: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    optional_attention_projections: tuple[str, ...] = ()
    # config.layer_types' types of blocks holding both a linear mixer and softmax attention, side by
    # side (falcon_h1's "hybrid" blocks add the two outputs)
    parallel_layer_types: tuple[str, ...] = ()
    layer_paths: tuple[tuple[str, LayerPaths], ...] = ()  # layer type -> its paths, where not the attributes above
    # blocks transformers ties across layers (one set of weights used at several depths): laquant makes
    # each tied group one module, so it is quantized once, calibrated on all its uses and stored once
    shared_blocks: tuple[str, ...] = ()
    # laquant's own implementation of an fla model type: laquant.models.<it> (CONFIG_CLASS, MODEL_CLASS,
    # check_supported) and laquant.adapters.<it> (ADAPTER)
    native_module: str = ""
    # vision-language wrappers: the text decoder's path (it holds layers and embed_tokens), the
    # modules kept as they are (the vision tower and its projector), and the Auto class that builds
    # the whole model (its config's layer_types are in text_config)
    text_model: str = "model"
    # the type of every layer where the config lists none (transformers' Mamba2Config has layer_types only
    # since 5.2x; every Mamba2 block is a linear mixer)
    uniform_layer_type: str = ""
    vision: tuple[str, ...] = ()
    auto_class: str = "AutoModelForCausalLM"

    @property
    def native(self) -> bool:
        """laquant runs its own implementation of the model (fla's GLA and Gated DeltaNet), not
        transformers' with laquant's mixer put in."""
        return bool(self.native_module)

    def _native(self, package: str):
        import importlib

        return importlib.import_module(f"laquant.{package}.{self.native_module}")

    @property
    def mixer_class(self) -> type:
        from laquant.models import hybrid_mixers

        return getattr(hybrid_mixers, self.mixer)

    def adapter(self, model):
        """The adapter of ``model`` (checks its layout; changes nothing: see ``Adapter.install``)."""
        if self.native:
            return self._native("adapters").ADAPTER(model)
        from laquant.adapters.hybrid import HybridAdapter

        return HybridAdapter(model, self)

    def config(self, cfg: dict):
        """The config object of a ``config.json`` dict of this family (ValueError: unsupported options)."""
        if self.native:
            module = self._native("models")
            config = module.CONFIG_CLASS.from_dict(cfg)
            module.check_supported(config)
            return config
        cls = self.config_class()
        # transformers writes inf/nan as {"__float__": "Infinity"} (e.g. bamba's time_step_limit)
        decode = getattr(cls, "_decode_special_floats", None)
        return cls.from_dict(decode(cfg) if decode is not None else cfg)

    def config_class(self) -> type:
        """The family's config class: transformers' own, looked up by name, never through ``AutoConfig``'s
        registry, where another package may have put its own class for the same model type (fla registers its
        Mamba2Config as ``mamba2`` when it is imported, and ``AutoConfig`` then builds fla's)."""
        if self.native:
            return self._native("models").CONFIG_CLASS
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        return self._transformers_class(CONFIG_MAPPING_NAMES, "config")

    def model_class(self) -> type:
        """The class whose ``from_pretrained`` builds the model: transformers' own, by name (see
        :meth:`config_class`), the causal LM or, for a vision-language family, what its Auto class builds."""
        if self.native:
            return self._native("models").MODEL_CLASS
        from transformers.models.auto import modeling_auto

        names = {"AutoModelForCausalLM": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                 "AutoModelForImageTextToText": modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES}
        return self._transformers_class(names[self.auto_class], "model")

    def from_config(self, config):
        """A randomly initialised model of ``config`` (what ``AutoModel*.from_config`` builds, by
        :meth:`model_class`)."""
        cls = self.model_class()
        return cls(config) if self.native else cls._from_config(config)

    def _transformers_class(self, names: dict, what: str) -> type:
        import transformers

        name = names.get(self.model_type)
        if name is None or not hasattr(transformers, name):
            raise LaquantError(f"transformers {transformers.__version__} has no {what} class for {self.model_type!r}: "
                               "install a transformers version with this model")
        return getattr(transformers, name)


def _minimax_cache():
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    from laquant.models.cache import ContiguousKV

    class LaquantMiniMaxCache(ContiguousKV, MiniMaxCache):  # MiniMaxModel accepts no other cache class
        """MiniMaxCache with the causal mask sized by a layer that holds keys. transformers (5.24) asks
        layer 0 for the cached length and the queries' offset; in MiniMax that is a linear layer, whose slot
        holds no keys, so a multi-token call that continues a cache (calibration's segments, a resumed
        prefill) masked out every cached key (tests/test_hybrid.py)."""

        def _keyed(self, layer_idx: int) -> int:
            if layer_idx < len(self.layers) and self.layers[layer_idx].get_seq_length() == 0:
                return next((i for i, layer in enumerate(self.layers) if layer.get_seq_length() > 0), layer_idx)
            return layer_idx

        def get_seq_length(self, layer_idx=0):  # the queries' offset too
            return super().get_seq_length(self._keyed(layer_idx))

        def get_mask_sizes(self, query, layer_idx=0):
            return super().get_mask_sizes(query, self._keyed(layer_idx))

    return LaquantMiniMaxCache()


@functools.cache
def _static_minimax_cache_class():
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    from laquant.models.static_hybrid import StaticHybridCache

    class StaticMiniMaxCache(StaticHybridCache, MiniMaxCache):
        """A static hybrid cache MiniMaxModel accepts (it takes no cache class but its own): the tensors are
        StaticHybridCache's, MiniMaxCache's own lists stay empty."""

        stands_for = MiniMaxCache

        def __init__(self, *args, **kwargs):
            MiniMaxCache.__init__(self)
            StaticHybridCache.__init__(self, *args, **kwargs)

    return StaticMiniMaxCache


_FAMILIES = (
    Family("gla", "gla", native_module="gla"),
    Family("qwen3_next", "delta", "linear_attn", "Qwen3NextGatedDeltaNet", "GatedDeltaNetMixer"),
    Family("minimax", "gla", "self_attn", "MiniMaxLightningAttention", "LightningMixer", cache=_minimax_cache,
           static_cache=_static_minimax_cache_class),
    Family("bamba", "gla", "mamba", "BambaMixer", "Mamba2Mixer"),
    # Qwen3.5: the text model's config type (AutoModelForCausalLM builds Qwen3_5ForCausalLM from it)
    Family("qwen3_5_text", "delta", "linear_attn", "Qwen3_5GatedDeltaNet", "SplitGatedDeltaNetMixer"),
    Family("qwen3_5_moe_text", "delta", "linear_attn", "Qwen3_5MoeGatedDeltaNet", "SplitGatedDeltaNetMixer"),
    # the vision-language models (Qwen3_5[Moe]ForConditionalGeneration): the language model quantized as
    # the text model's family; the vision tower (its patch merger, the projector, inside) kept as it is;
    # calibrated on text alone
    Family("qwen3_5", "delta", "linear_attn", "Qwen3_5GatedDeltaNet", "SplitGatedDeltaNetMixer",
           text_model="model.language_model", vision=("model.visual",), auto_class="AutoModelForImageTextToText"),
    Family("qwen3_5_moe", "delta", "linear_attn", "Qwen3_5MoeGatedDeltaNet", "SplitGatedDeltaNetMixer",
           text_model="model.language_model", vision=("model.visual",), auto_class="AutoModelForImageTextToText"),
    Family("olmo_hybrid", "delta", "linear_attn", "OlmoHybridGatedDeltaNet", "OlmoGatedDeltaNetMixer"),
    Family("nemotron_h", "gla", "mixer", "NemotronHMamba2Mixer", "Mamba2Mixer", attention_attr="mixer",
           mlp_layer_types=("mlp", "moe")),
    # Kimi Linear: KDA (the delta rule with a per-channel decay) + MLA softmax attention + MoE
    Family("kimi_linear", "kda", "self_attn", "KimiLinearDeltaAttention", "KimiDeltaAttentionMixer",
           attention_projections=("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"),
           optional_attention_projections=("q_proj", "q_a_proj", "q_b_proj")),
    # Ling / Ring hybrids: KDA with a full-rank bounded gate + MLA with a head-wise output gate (kept) + MoE
    Family("bailing_hybrid", "kda", "self_attn", "BailingHybridDeltaAttention", "BailingKDAMixer",
           attention_projections=("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")),
    # Granite 4: bamba's mixer; the MoE (block_sparse_moe) beside a shared MLP (shared_mlp); the
    # embedding / residual / attention / logits multipliers stay in transformers' decoder
    Family("granitemoehybrid", "gla", "mamba", "GraniteMoeHybridMambaLayer", "Mamba2Mixer"),
    # Mamba2 language models (Mamba-2, Codestral Mamba): Mamba2 blocks alone, the decoder under `backbone`
    Family("mamba2", "gla", "mixer", "Mamba2Mixer", "Mamba2Mixer", text_model="backbone",
           uniform_layer_type="linear_attention"),
    # Falcon-H1: every block runs Mamba2 and softmax attention in parallel; muP multipliers
    Family("falcon_h1", "gla", "mamba", "FalconH1Mixer", "FalconH1Mamba2Mixer", parallel_layer_types=("hybrid",)),
    # Zamba2: Mamba2 layers; a "hybrid" layer runs a shared transformer block (attention + MLP, each
    # use with its own LoRA adapters) and a Linear before its Mamba2 layer
    Family("zamba2", "gla", "mamba", "Zamba2MambaMixer", "Mamba2Mixer", parallel_layer_types=("hybrid",),
           layer_paths=(("hybrid", LayerPaths(
               "mamba_decoder.mamba", "shared_transformer.self_attn",
               ("shared_transformer.feed_forward", "linear", *(f"shared_transformer.self_attn.linear_{p}_adapter_list"
                                                               for p in "qkv")))),),
           shared_blocks=("shared_transformer",)),
    # fla's Gated DeltaNet (fla-format checkpoints, loaded without fla), on laquant's implementation
    Family("gated_deltanet", "delta", native_module="gated_deltanet"),
    # fla's DeltaNet: the delta rule without a decay (the gated delta rule's kernels with g = 0)
    Family("delta_net", "delta", native_module="delta_net"),
)
FAMILIES: dict[str, Family] = {f.model_type: f for f in _FAMILIES}


def get_family(model_type: str | None, what: str = "model_type") -> Family:
    if model_type not in FAMILIES:
        raise LaquantError(f"{what} {model_type!r} is not supported; supported: {', '.join(FAMILIES)}")
    return FAMILIES[model_type]


def static_hybrid_class(prefill_cache) -> type:
    """The static cache class a prefilled transformers hybrid cache becomes for graphed decode steps:
    :class:`~laquant.models.static_hybrid.StaticHybridCache`, or a family's subclass that is also the cache class
    its model insists on (``Family.static_cache``), where ``prefill_cache`` is one of those."""
    from laquant.models.static_hybrid import StaticHybridCache

    for family in FAMILIES.values():
        if family.static_cache is not None and isinstance(prefill_cache, (cls := family.static_cache()).stands_for):
            return cls
    return StaticHybridCache
