"""Stats + recipe -> per-module decisions (``plan``) -> quantized modules in the model.

One handler per decision kind (:data:`HANDLERS`, as torchao registers one handler per config) with
two constructors: ``from_stats`` quantizes a module's real weights with its calibrated statistics
(:func:`apply`), ``empty`` builds the quantized module with the recorded shapes only, to load a
checkpoint's state dict into (:func:`build_empty`). Decisions are typed
(:mod:`laquant.decisions`) and recorded as JSON in ``config.json``'s ``quantization_config``.
"""

from __future__ import annotations

import itertools
import warnings

import torch

from laquant.calibration.stats import Stats
from laquant.decisions import Decisions, ExpertsDecision, GateDecision, ProjectionDecision, StateDecision
from laquant.errors import LaquantError
from laquant.families import OUTPUT_PROJECTIONS
from laquant.kernels.common.formats import get_format
from laquant.kernels.common.numerics import absmax_scale
from laquant.kernels.common.state import StateQuantizer
from laquant.quant.experts import QuantExperts, experts_form, unsupported_reason
from laquant.quant.modules import QuantGate, QuantLinear


def select_outliers(absmax: torch.Tensor, threshold: float | None, top_k: int | None) -> list[int]:
    """Input channels kept in high precision: the ``top_k`` largest calibrated absmax, or those above ``threshold``."""
    if top_k is not None:
        return sorted(absmax.topk(min(top_k, absmax.numel())).indices.tolist())
    if threshold is None:
        return []
    return (absmax > threshold).nonzero().flatten().tolist()


def check_roles(adapter, recipe: dict) -> None:
    """A recipe that asks to quantize a role the model lacks is an error, not a silent no-op."""
    model_type = getattr(adapter.model.config, "model_type", "?")
    asked = {
        "softmax_attention": (recipe["softmax_attention"]["format"] != "keep", adapter.attention_projections,
                              "softmax-attention layers", "softmax_attention.format=keep"),
        "gates": (recipe["gates"]["format"] != "keep", adapter.gates, "gate projections", "gates.format=keep"),
        "state": (recipe["state"]["format"] != "fp32", adapter.mixers, "linear-attention layers (no recurrent state)",
                  "state.format=fp32 --set state.rounding=nearest"),
        "projections": (recipe["projections"]["format"] != "keep", adapter.projections, "projections",
                        "projections.format=keep"),
    }
    for role, (wanted, present, what, fix) in asked.items():
        if wanted and not present():
            raise LaquantError(f"recipe {recipe['name']!r} quantizes {role}, but this {model_type} model has no "
                               f"{what}; use a recipe for this family or --set {fix}")


def plan(adapter, stats: Stats, recipe: dict) -> Decisions:
    check_roles(adapter, recipe)
    proj_recipe, gate_recipe, state_recipe = recipe["projections"], recipe["gates"], recipe["state"]
    projections = dict(adapter.projections())
    if "lm_head" not in recipe["keep"]:
        projections.update({n: adapter.module(n) for n in adapter.kept()["lm_head"]})
    decisions = Decisions()
    if recipe["softmax_attention"]["format"] == "int8":
        # the attention layers' q/k/v/o get the projections' treatment (W8A8 with outlier split)
        for name in adapter.attention_projections():
            if (decision := _projection_decision(name, stats, proj_recipe, "softmax_attention")) is not None:
                decisions.projections[name] = decision
    if proj_recipe["format"] == "int8":
        for name in projections:
            if (decision := _projection_decision(name, stats, proj_recipe)) is not None:
                decisions.projections[name] = decision
    if gate_recipe["format"] == "int8":
        for name, gate in adapter.gates().items():
            start, n_channels = adapter.gate_channels(name) or (None, _linears(gate)[-1].out_features)
            decisions.gates[name] = GateDecision(n_channels, start, gate_recipe["weight_granularity"],
                                                 gate_recipe["scaling"], gate_recipe["clamp"])
    for name in adapter.mixers():
        decisions.state[name] = StateDecision(state_recipe["format"], state_recipe["renorm_interval"],
                                              state_recipe["prefill_roundtrip"], state_recipe["rounding"])
    if recipe["experts"]["format"] == "int8" and "experts" not in recipe["keep"]:
        decisions.experts = experts_decisions(adapter)
    return decisions


def experts_decisions(adapter) -> dict[str, ExpertsDecision]:
    """int8 weights for every MoE experts module :class:`QuantExperts` can stand in for; the others stay as they are,
    with a warning that names them and why."""
    out, left = {}, {}
    for name in adapter.kept().get("experts", []):
        experts = adapter.module(name)
        if (reason := unsupported_reason(experts)) is not None:
            left[name] = reason
            continue
        out[name] = ExpertsDecision(*experts_form(experts))
    if left:
        name, reason = next(iter(left.items()))
        warnings.warn(f"laquant: {len(left)} MoE experts modules keep their weights ({name}: {reason})", stacklevel=3)
    return out


def _projection_decision(name: str, stats: Stats, proj_recipe: dict, role: str | None = None):
    """W8A8 with outlier split. When more than the recipe's ``outlier_max_fraction`` of the input channels are
    outliers (or all of them), such an int8 layer would be mostly the bf16 layer with the int8 product as extra
    work: it stays in high precision (None), or with ``outlier_fallback: weight_only`` becomes weight-only int8
    (no activation quantization, so no outlier columns)."""
    absmax = stats.get(name, "act_absmax")
    outliers = select_outliers(absmax, proj_recipe["outlier_threshold"], proj_recipe["outlier_top_k"])
    max_fraction = proj_recipe.get("outlier_max_fraction")
    if len(outliers) == absmax.numel() or (max_fraction is not None and len(outliers) > max_fraction * absmax.numel()):
        if proj_recipe.get("outlier_fallback", "keep") == "weight_only":
            return ProjectionDecision([], proj_recipe["weight_granularity"], "none", role)
        return None
    granularity = proj_recipe["act_granularity"]
    if proj_recipe.get("output_act_granularity") is not None and name.rpartition(".")[2] in OUTPUT_PROJECTIONS:
        granularity = proj_recipe["output_act_granularity"]
    return ProjectionDecision(outliers, proj_recipe["weight_granularity"], granularity, role)


def _device(module) -> torch.device:
    return next(itertools.chain(module.parameters(), module.buffers())).device


def _linears(gate) -> list:
    return list(gate) if isinstance(gate, torch.nn.Sequential) else [gate]


def static_state_scale(state_absmax: torch.Tensor, fmt: str) -> torch.Tensor:
    """Calibrated scale for a state ``[H, K]`` absmax, shaped to broadcast over ``[B, H, K, V]``:
    the format's own scale of a state whose rows are their absmax."""
    spec = get_format(fmt)
    return absmax_scale(state_absmax.unsqueeze(-1), spec.scale_dims, spec.qmax)


# ------------------------------------------------------------------------------------- handlers
# from_stats(module, name, decision, stats, adapter) and empty(module, name, decision, adapter, dtype)
# return what takes the module's place (None: the module is changed in place).

class ProjectionHandler:
    @staticmethod
    def from_stats(linear, name, d: ProjectionDecision, stats, adapter):
        outliers = torch.tensor(d.outliers, dtype=torch.long)
        return QuantLinear.from_linear(linear, outliers, d.weight_granularity, d.act_granularity)

    @staticmethod
    def empty(linear, name, d: ProjectionDecision, adapter, dtype):
        return QuantLinear(linear.in_features, linear.out_features, len(d.outliers), linear.bias is not None,
                           d.weight_granularity, d.act_granularity, dtype=dtype).to(linear.weight.device)


class GateHandler:
    @staticmethod
    def _wrap(gate, d: GateDecision, quantize_linear):
        linears = []
        for lin in _linears(gate):
            if isinstance(lin, QuantLinear) or d.channel_start is not None:
                # a slice of a fused projection: the projection's own decision quantizes it (or keeps it)
                linears.append(lin)
            else:
                linears.append(quantize_linear(lin).to(lin.weight.device))
        new = QuantGate(*linears, n_channels=d.n_channels, scaling=d.scaling, clamp=d.clamp,
                        channel_start=d.channel_start)
        return new.to(_device(linears[-1]))

    @classmethod
    def from_stats(cls, gate, name, d: GateDecision, stats, adapter):
        new = cls._wrap(gate, d, lambda lin: QuantLinear.from_linear(lin, torch.zeros(0, dtype=torch.long),
                                                                       d.weight_granularity, "none"))
        new.calibrate(stats.get(name, "logit_min").to(new.logit_min.device),
                      stats.get(name, "logit_max").to(new.logit_max.device))
        return new

    @classmethod
    def empty(cls, gate, name, d: GateDecision, adapter, dtype):
        return cls._wrap(gate, d, lambda lin: QuantLinear(lin.in_features, lin.out_features, 0, lin.bias is not None,
                                                          d.weight_granularity, "none", dtype=dtype))


class StateHandler:
    @staticmethod
    def _set(mixer, name, d: StateDecision, static: torch.Tensor | None):
        if static is not None:
            mixer.register_buffer("state_static_scale", static.to(next(mixer.parameters(), static).device))
            static = mixer.state_static_scale
        try:
            mixer.state_quantizer = StateQuantizer(d.format, d.renorm_interval, static, d.rounding)
            mixer.prefill_roundtrip = d.prefill_roundtrip
        except ValueError as exc:
            raise LaquantError(f"{name}: {exc}") from None

    @staticmethod
    def _static(d: StateDecision) -> bool:
        return d.renorm_interval == 0 and get_format(d.format).is_scaled

    @classmethod
    def from_stats(cls, mixer, name, d: StateDecision, stats, adapter):
        static = static_state_scale(stats.get(name, "state_absmax"), d.format) if cls._static(d) else None
        cls._set(mixer, name, d, static)

    @classmethod
    def empty(cls, mixer, name, d: StateDecision, adapter, dtype):
        static = None
        if cls._static(d):
            info = adapter.mixers()[name]
            static = torch.ones(get_format(d.format).scale_shape(info.num_heads, info.head_k), dtype=torch.float32)
        cls._set(mixer, name, d, static)


class ExpertsHandler:
    @staticmethod
    def _check(new: QuantExperts, name, d: ExpertsDecision) -> QuantExperts:
        if (new.activation, new.gated, new.limit) != (d.activation, d.gated, d.limit):
            raise LaquantError(f"{name}: the checkpoint's experts are {d.activation} (gated={d.gated}, "
                               f"limit={d.limit}), this model's {new.activation} (gated={new.gated}, "
                               f"limit={new.limit}); load it into the model it was made from")
        return new

    @classmethod
    def from_stats(cls, experts, name, d: ExpertsDecision, stats, adapter):
        return cls._check(QuantExperts.from_experts(experts), name, d)

    @classmethod
    def empty(cls, experts, name, d: ExpertsDecision, adapter, dtype):
        try:
            new = QuantExperts.shaped_like(experts)
        except ValueError as exc:
            raise LaquantError(f"{name}: {exc}; the checkpoint has them in int8") from None
        return cls._check(new, name, d)


HANDLERS = {ProjectionDecision: ProjectionHandler, GateDecision: GateHandler, StateDecision: StateHandler,
            ExpertsDecision: ExpertsHandler}


def handler_for(decision):
    handler = HANDLERS.get(type(decision))
    if handler is None:
        raise LaquantError(f"no quantization handler for a {type(decision).__name__}; "
                           f"known: {', '.join(t.__name__ for t in HANDLERS)}")
    return handler


def _rewrite(adapter, decisions: Decisions | dict, build, only=None) -> None:
    if not isinstance(decisions, Decisions):
        decisions = Decisions.from_dict(decisions)
    from laquant.generate import release_all_graphs

    release_all_graphs(adapter.model)  # captured graphs read the modules being replaced
    for name, decision in decisions.every_module():
        if only is not None and not only(name):
            continue
        new = build(handler_for(decision), adapter.module(name), name, decision)
        if new is not None:
            adapter.replace(name, new)


@torch.no_grad()
def apply(model, adapter, decisions: Decisions | dict, stats: Stats, only=None) -> None:
    """Quantize ``model`` in place by ``decisions``, from its real weights and ``stats``; ``only(name)``:
    just the modules it accepts (a model streamed layer by layer, :mod:`laquant.streaming`)."""
    _rewrite(adapter, decisions, lambda h, module, name, d: h.from_stats(module, name, d, stats, adapter), only)


@torch.no_grad()
def build_empty(model, adapter, decisions: Decisions | dict) -> None:
    """Rewrite ``model`` into empty quantized modules of the recorded shapes (to load a checkpoint into)."""
    dtype = next(model.parameters()).dtype
    _rewrite(adapter, decisions, lambda h, module, name, d: h.empty(module, name, d, adapter, dtype))
