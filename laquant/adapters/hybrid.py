"""The adapter of transformers' hybrid models: linear-attention (or SSM) layers interleaved with
softmax attention, with dense or MoE MLPs.

One class serves every hybrid family; a family's entry in :mod:`laquant.families` says where its
linear mixer sits (``mixer_attr``), which transformers class that is (``source_class``) and which of
laquant's mixers (:mod:`laquant.models.hybrid_mixers`) replaces it. The mixer class knows its own
layout (modules, fused splits, gate, decay parameters, state shape).

Building an adapter only reads the model and checks its layout against what the family expects
(layer types, the mixer's modules, the split of its fused projections). :meth:`HybridAdapter.install`
then puts laquant's mixers in place of transformers' linear-attention modules (same parameter
names), so the state path runs on laquant's ops in the recipe's state format, and gives the decoder
layers' norms that feed W8A8 projections their codes-writing forward (:mod:`laquant.models.quantizing_rowwise`,
transformers' own forward wherever those projections are not W8A8 on the GPU), the last norm and the rotary
embedding's cos and sin a one-launch forward on the GPU (:mod:`laquant.models.fused_rotary`), and Qwen3-Next's gated
attention layers, and the MLA layers of Kimi Linear and Ling / Ring, a forward for the static decode step
(:mod:`laquant.models.gated_attention`, :mod:`laquant.models.mla_attention`), and the MoE routers and Qwen3-Next's
MoE blocks forwards of fewer launches (:mod:`laquant.models.fused_moe`); everything else stays transformers'.

Roles: ``projections`` (the mixers' and MLPs' ``nn.Linear``), ``gates`` (the mixer's gate
projection: GDN's ``in_proj_ba``, Mamba2's ``dt`` channels of ``in_proj``, KDA's
``forget_gate.f_b_proj`` or ``forget_gate.f_proj``), ``mixers`` (the state and its layout),
``softmax_attention`` (q/k/v/o of the attention layers; MLA's q / kv_a / kv_b / o in kimi_linear and
bailing_hybrid, from the family's ``attention_projections``), and kept ones: ``routers``
(MoE router and shared-expert gate), ``experts`` (3-D expert weights), ``conv``, ``decay``
(``A_log``, ``dt_bias``, ``D``, Lightning's ``slope_rate``), embeddings, norms, lm_head.
"""

from __future__ import annotations

import inspect
import weakref

import torch
import torch.nn as nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from laquant.adapters.base import Adapter, MixerInfo
from laquant.errors import LaquantError
from laquant.models import fused_moe, fused_rotary, gated_attention, mla_attention, quantizing_rowwise
from laquant.models.cache import passed_cache, reorder_rows, state_store

LAYER_TYPES = ("linear_attention", "full_attention")


def _resolve(obj, path: str):
    """The module at the dotted attribute ``path`` below ``obj`` (None where a part is missing)."""
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj


def _assign(obj, path: str, value) -> None:
    parent, _, attr = path.rpartition(".")
    setattr(_resolve(obj, parent) if parent else obj, attr, value)


def _first_of_each(named: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """``named`` with each module under its first name only (a shared block's modules appear under
    every layer that uses it)."""
    seen, out = set(), {}
    for name, module in named.items():
        if id(module) not in seen:
            seen.add(id(module))
            out[name] = module
    return out


def _drop_shared_aliases(module, state_dict, prefix, local_metadata) -> None:
    """A block used at several depths is one module: its tensors stay under its first use only."""
    for alias in module._laquant_shared_blocks:
        for key in [k for k in state_dict if k.startswith(f"{prefix}{alias}.")]:
            del state_dict[key]


def _positions_from_state_store(module, args, kwargs):
    """Give each call with a cache the positions that continue the sequence. transformers' hybrids
    do not all derive them from the cache (bamba starts at 0 on every call; minimax asks a linear
    layer of its cache for the length), so laquant counts the tokens in its state store: also those of
    calls that bring their own positions (transformers' generate does), so that a later call without
    them goes on where the cache is."""
    cache = passed_cache(kwargs)
    if cache is None or kwargs.get("laquant_graph_step"):
        return None  # a marked step's positions: _graph_step_forward's, where it runs eagerly
    ids = args[0] if args else kwargs.get("input_ids")
    ref = ids if ids is not None else kwargs.get("inputs_embeds")
    store = state_store(cache)
    start = store.seen_tokens
    if kwargs.get("position_ids") is not None:
        if not store.static or store.counts_on_host:  # a static cache's steps are counted on the device
            store.seen_tokens += ref.shape[1]
        return None
    store.seen_tokens += ref.shape[1]
    kwargs["position_ids"] = torch.arange(start, start + ref.shape[1], device=ref.device).unsqueeze(0)
    return args, kwargs


def _reorder_cache(cache, beam_idx: torch.Tensor):
    """transformers' beam search on a hybrid with laquant's mixers (the model's ``_reorder_cache``, which generate
    calls in place of the cache's ``reorder_cache``): the softmax layers' keys as transformers reorders them, and
    laquant's states and conv inputs beside them (without this, beams went on from other beams' states)."""
    if not hasattr(cache, "reorder_cache"):
        raise ValueError(f"{type(cache).__name__} cannot be reordered for beam search")
    cache.reorder_cache(beam_idx)
    store = getattr(cache, "laquant_states", None)
    if store is not None:
        reorder_rows(store, beam_idx)
    return cache


_positions_from_state_store.laquant_cacheless_noop = True  # a hook a replayed cacheless forward may skip


def is_adapted_hybrid(model) -> bool:
    """Whether ``model`` is a transformers hybrid whose forward laquant wrapped (:func:`_install_graph_steps`)."""
    forward = model.__dict__.get("forward")
    return isinstance(forward, _InstanceMethod) and forward.fn is _graph_step_forward


def _cacheless_ids(args: tuple, kwargs: dict):
    """The token ids of a call with nothing but them and ``use_cache`` False or unset (lm-eval's ``HFLM`` scores
    text so), else None."""
    if len(args) > 1 or set(kwargs) - {"input_ids", "use_cache"} or kwargs.get("use_cache"):
        return None
    return args[0] if args else kwargs.get("input_ids")


def _marked_prepare_inputs(model, *args, **kwargs) -> dict:
    """transformers' ``prepare_inputs_for_generation``, its steps marked for :func:`_graph_step_forward`. A family
    whose model makes a cache of its own class when it is given none (MiniMax) gets laquant's twin of that class
    (``Family.cache``): transformers' own sizes the causal mask by a layer without keys, so the decode steps of a
    padded batch masked its padded sequences' cached keys wrongly (their logits ~1% off those of the sequence alone)."""
    from laquant.adapters import cache_kwargs, new_cache
    from laquant.families import FAMILIES

    inputs = type(model).prepare_inputs_for_generation(model, *args, **kwargs)
    keyword = next(iter(cache_kwargs(model, None)))
    if inputs.get(keyword) is None and inputs.get("use_cache", True):
        family = FAMILIES.get(getattr(model.config, "model_type", None))
        if family is not None and family.cache is not None:
            inputs[keyword] = new_cache(model)
    return {**inputs, "laquant_graph_step": True}


def _graph_step_forward(model, *args, laquant_graph_step: bool = False, **kwargs):
    """transformers' forward, where a marked decode step may replay a CUDA graph
    (:func:`laquant.models.graphed_step.hybrid_graph_step`), and so may a call with token ids only, where graphed
    forwards are on (:func:`laquant.serving.graphed_forward.graphed_logits`)."""
    if laquant_graph_step:
        from laquant.models.graphed_step import hybrid_graph_step
        from laquant.serving.graphed_hybrid_prefill import hybrid_generate_prefill

        out = hybrid_graph_step(model, args, kwargs)
        if out is None:
            out = hybrid_generate_prefill(model, args, kwargs)
        if out is not None:
            return out
        if (moved := _positions_from_state_store(model, args, kwargs)) is not None:  # what the hook skipped
            args, kwargs = moved
    elif (ids := _cacheless_ids(args, kwargs)) is not None:
        from laquant.serving.graphed_forward import graphed_logits

        logits = graphed_logits(model, ids)
        if logits is not None:  # no cache returned: the caller asked for none, or (use_cache unset) uses none
            return CausalLMOutputWithPast(logits=logits)
    return type(model).forward(model, *args, **kwargs)


class _InstanceMethod:
    """``fn`` as a method of one model instance, holding the model by a weak reference: a bound method
    in the instance's ``__dict__`` would make a reference cycle, and the model (GBs of weights) would
    outlive ``del model`` until the garbage collector runs. Its signature is the wrapped method's
    (transformers' generate checks its arguments by it); a deep copy of the model gets one bound to the copy."""

    def __init__(self, fn, model, name: str):
        self.fn, self.name, self.ref = fn, name, weakref.ref(model)
        self.__signature__ = inspect.signature(getattr(type(model), name).__get__(model))

    def __call__(self, *args, **kwargs):
        return self.fn(self.ref(), *args, **kwargs)

    def __deepcopy__(self, memo):
        model = self.ref()
        return _InstanceMethod(self.fn, memo.get(id(model), model), self.name)


def _install_graph_steps(model: nn.Module) -> None:
    """transformers' ``generate`` on ``model`` replays a graph per decode step: its instance's
    ``prepare_inputs_for_generation`` marks the steps and its ``forward`` takes them. A model whose
    methods another library has wrapped already (accelerate's device hooks) is left as it is."""
    if "forward" in model.__dict__ or "prepare_inputs_for_generation" in model.__dict__:
        return
    if not hasattr(type(model), "prepare_inputs_for_generation"):
        return
    model.prepare_inputs_for_generation = _InstanceMethod(_marked_prepare_inputs, model, "prepare_inputs_for_generation")
    model.forward = _InstanceMethod(_graph_step_forward, model, "forward")


class HybridAdapter(Adapter):
    attention_attr = "self_attn"

    def __init__(self, model: nn.Module, family):
        super().__init__(model)
        self.family = family
        self.model_type = family.model_type
        self.mixer_attr, self.mixer_class = family.mixer_attr, family.mixer_class
        self.attention_attr = family.attention_attr
        allowed = LAYER_TYPES + family.mlp_layer_types + family.parallel_layer_types
        self.prefix = family.text_model  # where the text decoder sits: model, or a VL model's model.language_model
        inner = _resolve(model, self.prefix)
        if inner is None or not isinstance(getattr(inner, "layers", None), nn.ModuleList):
            raise LaquantError(f"{self.model_type} adapter: expected a model with {self.prefix}.layers (a ModuleList); "
                               f"got {type(model).__name__}")
        self.layers = list(inner.layers)
        types = getattr(model.config.get_text_config(), "layer_types", None)
        if types is None and family.uniform_layer_type:
            types = [family.uniform_layer_type] * len(self.layers)
        if types is None or len(types) != len(self.layers):
            raise LaquantError(f"{self.model_type} adapter: cannot resolve the layer types: config.layer_types is "
                               f"{types!r}, expected one of {allowed} for each of the {len(self.layers)} layers")
        for i, t in enumerate(types):
            if t not in allowed:
                raise LaquantError(f"{self.model_type} adapter: cannot resolve the type of {self.prefix}.layers.{i}: "
                                   f"config.layer_types[{i}] = {t!r}; expected one of {allowed}")
        self.layer_types = list(types)
        for i in self.linear_layers():
            mixer = _resolve(self.layers[i], self.mixer_path(i))
            if not isinstance(mixer, self.mixer_class):
                self.check_layout(self.mixer_name(i), mixer)
        for i in self.attention_layers():
            attn = _resolve(self.layers[i], self.attention_path(i))
            optional = family.optional_attention_projections
            missing = [p for p in family.attention_projections
                       if not isinstance(getattr(attn, p, None), nn.Module)
                       and not (p in optional and hasattr(attn, p) and getattr(attn, p) is None)]
            if attn is None or missing:
                raise LaquantError(f"{self.model_type} adapter: {self.prefix}.layers.{i}.{self.attention_path(i)} "
                                   f"({type(attn).__name__}) is not the expected softmax attention: missing "
                                   f"{', '.join(missing)}; expected {', '.join(family.attention_projections)}")

    # layout
    def linear_layers(self) -> list[int]:
        both = self.family.parallel_layer_types
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention" or t in both]

    def attention_layers(self) -> list[int]:
        both = self.family.parallel_layer_types
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention" or t in both]

    def _paths(self, i: int):
        return dict(self.family.layer_paths).get(self.layer_types[i])

    def mixer_path(self, i: int) -> str:
        """Layer ``i``'s linear mixer, as a dotted path from the layer."""
        return paths.mixer if (paths := self._paths(i)) else self.mixer_attr

    def attention_path(self, i: int) -> str:
        return paths.attention if (paths := self._paths(i)) else self.attention_attr

    def mixer_name(self, i: int) -> str:
        return f"{self.prefix}.layers.{i}.{self.mixer_path(i)}"

    def check_layout(self, name: str, mixer: nn.Module) -> None:
        """Raise naming ``name`` and the expected layout when transformers' mixer differs from it."""
        if type(mixer).__name__ != self.family.source_class:
            raise LaquantError(f"{self.model_type} adapter: {name} is {type(mixer).__name__}, expected transformers' "
                               f"{self.family.source_class} (this transformers version lays the model out differently)")
        cls = self.mixer_class
        expected = [*cls.MODULES, *cls.PARAMETERS, *cls.BUFFERS, *cls.ATTRS]
        missing = [a for a in expected if not hasattr(mixer, a)]
        if missing:
            raise LaquantError(f"{self.model_type} adapter: {name} ({type(mixer).__name__}) lacks "
                               f"{', '.join(missing)}; expected attributes: {', '.join(expected)} (a transformers "
                               "version with a different layout)")
        for fused, want in cls.fused_splits(mixer).items():
            got = getattr(mixer, fused).out_features
            if got != sum(want.values()):
                parts = " + ".join(f"{k} {v}" for k, v in want.items())
                raise LaquantError(f"{self.model_type} adapter: fused projection {name}.{fused} has {got} outputs; "
                                   f"its split is unknown (expected {parts} = {sum(want.values())})")
        if (problem := cls.layout_problem(mixer)) is not None:
            raise LaquantError(f"{self.model_type} adapter: {name}: {problem}")

    def install(self) -> None:
        for i in self.linear_layers():
            layer, path = self.layers[i], self.mixer_path(i)
            if not isinstance(_resolve(layer, path), self.mixer_class):
                _assign(layer, path, self.mixer_class(_resolve(layer, path)))
        self._share_tied_blocks()
        quantizing_rowwise.install(self.layers)
        quantizing_rowwise.install_final_norm(_resolve(self.model, self.prefix))
        fused_rotary.install(_resolve(self.model, self.prefix))
        fused_moe.install(self.model)
        gated_attention.install(self.layers)
        mla_attention.install(self.layers)
        if not getattr(self.model, "_laquant_positions_hook", False):
            self.model.register_forward_pre_hook(_positions_from_state_store, with_kwargs=True)
            self.model._laquant_positions_hook = True
            _install_graph_steps(self.model)
        if not hasattr(type(self.model), "_reorder_cache"):
            self.model._reorder_cache = _reorder_cache

    def _share_tied_blocks(self) -> None:
        """Make each group of blocks whose weights transformers ties (the same Parameters in separate
        modules) one module: quantizing it then replaces it at every use, its observers see every
        use, and its tensors are stored once (the model's state dict names them under the first use
        only). A block tied only in part cannot be quantized once."""
        aliases = getattr(self.model, "_laquant_shared_blocks", {})
        for path in self.family.shared_blocks:
            groups: list[tuple[str, nn.Module, set[int]]] = []
            for i, layer in enumerate(self.layers):
                block = _resolve(layer, path)
                if block is None:
                    continue
                name, tensors = f"{self.prefix}.layers.{i}.{path}", {id(t) for t in block.state_dict(keep_vars=True).values()}
                for first, shared, ids in groups:
                    if block is shared or ids == tensors:
                        _assign(layer, path, shared)
                        aliases[name] = first
                        break
                    if ids & tensors:
                        raise LaquantError(f"{self.model_type} adapter: {name} shares some but not all of its weights "
                                           f"with {first}; laquant quantizes a block used at several depths once and "
                                           "needs it tied whole")
                else:
                    groups.append((name, block, tensors))
        if aliases and not hasattr(self.model, "_laquant_shared_blocks"):
            self.model.register_state_dict_post_hook(_drop_shared_aliases)
        if aliases:
            self.model._laquant_shared_blocks = aliases

    def mixer(self, i: int) -> nn.Module:
        mixer = _resolve(self.layers[i], self.mixer_path(i))
        if not isinstance(mixer, self.mixer_class):
            raise LaquantError(f"{self.mixer_name(i)} is still transformers' {type(mixer).__name__}: the roles refer "
                               "to laquant's mixers; call laquant.adapters.install(model) first (laquant.load_model "
                               "and laquant.load do)")
        return mixer

    # roles
    def _mlp_attrs(self, i: int) -> tuple[str, ...]:
        """The attributes of layer ``i`` that may hold its MLP / MoE block (and its other Linears)."""
        if (paths := self._paths(i)) is not None:
            return paths.linears
        if self.layer_types[i] in self.family.mlp_layer_types:
            return (self.mixer_attr,)
        return ("mlp", "feed_forward", "block_sparse_moe", "shared_mlp")

    def _layer_linears(self, i: int) -> dict[str, nn.Linear]:
        """The MLP side's Linears of layer ``i`` (routers excluded)."""
        routers = set(self._routers(i))
        out = {}
        for attr in self._mlp_attrs(i):
            block = _resolve(self.layers[i], attr)
            if block is not None:
                named = {f"{self.prefix}.layers.{i}.{attr}" + (f".{n}" if n else ""): m for n, m in block.named_modules()}
                out.update({n: m for n, m in named.items() if isinstance(m, nn.Linear) and n not in routers})
        return out

    def projections(self) -> dict[str, nn.Module]:
        out, linear = {}, set(self.linear_layers())
        for i in range(len(self.layers)):
            if i in linear:
                out.update({f"{self.mixer_name(i)}.{p}": self.mixer(i).get_submodule(p)
                            for p in self.mixer_class.PROJECTIONS})
            out.update(self._layer_linears(i))
        return _first_of_each(out)

    def attention_projections(self) -> dict[str, nn.Module]:
        out = {}
        for i in self.attention_layers():
            path = self.attention_path(i)
            attn = _resolve(self.layers[i], path)
            out.update({f"{self.prefix}.layers.{i}.{path}.{p}": getattr(attn, p)
                        for p in self.family.attention_projections if getattr(attn, p) is not None})
        return _first_of_each(out)

    def gates(self) -> dict[str, nn.Module]:
        gate = self.mixer_class.GATE
        if gate is None:
            return {}
        return {f"{self.mixer_name(i)}.{gate}": self.mixer(i).get_submodule(gate) for i in self.linear_layers()}

    def _mixer_of_gate(self, gate_name: str) -> nn.Module:
        return self.module(gate_name.removesuffix("." + self.mixer_class.GATE))

    def gate_channels(self, name: str) -> tuple[int, int] | None:
        return self._mixer_of_gate(name).gate_channels()

    def gate_log_decay(self, gate_name: str, logits: torch.Tensor) -> torch.Tensor:
        mixer = self._mixer_of_gate(gate_name)
        device = mixer.get_parameter(mixer.DECAY[0]).device  # statistics live on the CPU, the decay may not
        return mixer.gate_log_decay(logits.to(device)).to(logits.device)

    def mixers(self) -> dict[str, MixerInfo]:
        return {self.mixer_name(i): MixerInfo(self.mixer_name(i), i, *self.mixer(i).state_shape())
                for i in self.linear_layers()}

    def _routers(self, i: int) -> list[str]:
        out = []
        for attr in self._mlp_attrs(i):
            block = _resolve(self.layers[i], attr)
            for sub in ("gate", "router", "shared_expert_gate"):
                if block is not None and hasattr(block, "experts") and getattr(block, sub, None) is not None:
                    out.append(f"{self.prefix}.layers.{i}.{attr}.{sub}")
        return out

    def kept(self) -> dict[str, list[str]]:
        vision = self.family.vision
        named = {n: m for n, m in self.model.named_modules() if not any(n == v or n.startswith(f"{v}.") for v in vision)}
        norms = [n for n, m in named.items() if "norm" in type(m).__name__.lower() and n]
        experts = [n for n in named if n.endswith(".experts")]
        conv = [f"{self.mixer_name(i)}.conv1d" for i in self.linear_layers() if hasattr(self.mixer(i), "conv1d")]
        decay = [f"{self.mixer_name(i)}.{p}" for i in self.linear_layers() for p in self.mixer_class.DECAY]
        embedding = self.model.get_input_embeddings()  # embed_tokens, or embeddings (Nemotron-H, Mamba2 LMs)
        out = {"embeddings": [n for n, m in named.items() if m is embedding], "norms": norms, "lm_head": ["lm_head"],
               "routers": [r for i in range(len(self.layers)) for r in self._routers(i)], "experts": experts,
               "conv": conv, "decay": decay}
        if vision:
            out["vision"] = list(vision)  # never quantized, nor observed: calibration is text alone
        return out

    def new_cache(self):
        if self.family.cache is not None:
            return self.family.cache()
        from laquant.models.cache import dynamic_cache

        return dynamic_cache(self.model.config)

    # layer-by-layer calibration runs the whole model with layers onloaded by hooks (see run.py)
    def decoder_layers(self) -> list[tuple[str, nn.Module]]:
        return [(f"{self.prefix}.layers.{i}", layer) for i, layer in enumerate(self.layers)]


__all__ = ["HybridAdapter"]
