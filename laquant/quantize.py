"""Stats + recipe -> per-module decisions (``plan``) -> quantized modules in the model (``apply``).

Decisions are plain JSON (they go into ``config.json``'s ``quantization_config``), so a saved
checkpoint is rebuilt by ``apply(model, adapter, decisions)`` with empty modules of the right
shapes, then filled by ``load_state_dict``.
"""

from __future__ import annotations

import itertools

import torch

from laquant.calibration.stats import Stats
from laquant.errors import LaquantError
from laquant.quant.modules import QuantGate, QuantLinear
from laquant.kernels.common.formats import get_format
from laquant.kernels.common.state import StateQuantizer


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
                  "state.format=fp32"),
        "projections": (recipe["projections"]["format"] != "keep", adapter.projections, "projections",
                        "projections.format=keep"),
    }
    for role, (wanted, present, what, fix) in asked.items():
        if wanted and not present():
            raise LaquantError(f"recipe {recipe['name']!r} quantizes {role}, but this {model_type} model has no "
                               f"{what}; use a recipe for this family or --set {fix}")


def plan(adapter, stats: Stats, recipe: dict) -> dict:
    check_roles(adapter, recipe)
    proj_recipe, gate_recipe, state_recipe = recipe["projections"], recipe["gates"], recipe["state"]
    projections = dict(adapter.projections())
    if "lm_head" not in recipe["keep"]:
        projections.update({n: adapter.module(n) for n in adapter.kept()["lm_head"]})
    decisions: dict = {"projections": {}, "gates": {}, "state": {}}
    if recipe["softmax_attention"]["format"] == "int8":
        # the attention layers' q/k/v/o get the projections' treatment (W8A8 with outlier split)
        for name in adapter.attention_projections():
            if (decision := _projection_decision(name, stats, proj_recipe)) is not None:
                decisions["projections"][name] = {**decision, "role": "softmax_attention"}
    if proj_recipe["format"] == "int8":
        for name in projections:
            if (decision := _projection_decision(name, stats, proj_recipe)) is not None:
                decisions["projections"][name] = decision
    if gate_recipe["format"] == "int8":
        for name, gate in adapter.gates().items():
            start, n_channels = adapter.gate_channels(name) or (None, _linears(gate)[-1].out_features)
            decisions["gates"][name] = {
                "format": "int8", "weight_granularity": gate_recipe["weight_granularity"],
                "scaling": gate_recipe["scaling"], "clamp": gate_recipe["clamp"],
                "n_channels": n_channels, "channel_start": start,
            }
    for name in adapter.mixers():
        decisions["state"][name] = {"format": state_recipe["format"], "renorm_interval": state_recipe["renorm_interval"]}
    return decisions


def _projection_decision(name: str, stats: Stats, proj_recipe: dict) -> dict | None:
    """W8A8 with outlier split; None (the layer stays in high precision) when every input channel
    is an outlier: an int8 layer without int8 columns would be the bf16 layer with extra work."""
    absmax = stats.get(name, "act_absmax")
    outliers = select_outliers(absmax, proj_recipe["outlier_threshold"], proj_recipe["outlier_top_k"])
    if len(outliers) == absmax.numel():
        return None
    return {"format": "int8", "outliers": outliers, "weight_granularity": proj_recipe["weight_granularity"],
            "act_granularity": proj_recipe["act_granularity"]}


def _device(module) -> torch.device:
    return next(itertools.chain(module.parameters(), module.buffers())).device


def _linears(gate) -> list:
    return list(gate) if isinstance(gate, torch.nn.Sequential) else [gate]


def static_state_scale(state_absmax: torch.Tensor, fmt: str) -> torch.Tensor:
    """Calibrated scale for a state ``[H, K]`` absmax, shaped to broadcast over ``[B, H, K, V]``."""
    fmt = get_format(fmt)
    if fmt.granularity == "row":
        amax = state_absmax.unsqueeze(-1)
    elif fmt.granularity == "head":
        amax = state_absmax.amax(-1).view(-1, 1, 1)
    else:
        amax = state_absmax.amax()
    return (amax.float() / fmt.qmax).clamp_min(torch.finfo(torch.float32).tiny)


@torch.no_grad()
def apply(model, adapter, decisions: dict, stats: Stats | None = None) -> None:
    """Rewrite ``model`` in place. With ``stats``: quantize the real weights. Without: build empty
    modules of the recorded shapes (for loading a checkpoint's state dict into)."""
    dtype = next(model.parameters()).dtype
    for name, d in decisions["projections"].items():
        linear = adapter.module(name)
        if stats is not None:
            new = QuantLinear.from_linear(linear, torch.tensor(d["outliers"], dtype=torch.long),
                                          d["weight_granularity"], d["act_granularity"])
        else:
            new = QuantLinear(linear.in_features, linear.out_features, len(d["outliers"]), linear.bias is not None,
                              d["weight_granularity"], d["act_granularity"], dtype=dtype)
        adapter.replace(name, new.to(linear.weight.device))

    for name, d in decisions["gates"].items():
        gate = adapter.module(name)
        linears = []
        for lin in _linears(gate):
            if isinstance(lin, QuantLinear) or d.get("channel_start") is not None:
                # a slice of a fused projection: the projection's own decision quantizes it (or keeps it)
                linears.append(lin)
            elif stats is not None:
                q = QuantLinear.from_linear(lin, torch.zeros(0, dtype=torch.long), d["weight_granularity"], "none")
                linears.append(q.to(lin.weight.device))
            else:
                q = QuantLinear(lin.in_features, lin.out_features, 0, lin.bias is not None,
                                d["weight_granularity"], "none", dtype=dtype)
                linears.append(q.to(lin.weight.device))
        new = QuantGate(*linears, n_channels=d["n_channels"], scaling=d["scaling"], clamp=d["clamp"],
                        channel_start=d.get("channel_start"))
        if stats is not None:
            new.calibrate(stats.get(name, "logit_min"), stats.get(name, "logit_max"))
        adapter.replace(name, new.to(_device(linears[-1])))

    mixers = adapter.mixers()
    for name, d in decisions["state"].items():
        mixer = adapter.module(name)
        fmt = get_format(d["format"])
        static = None
        if d["renorm_interval"] == 0 and fmt.is_scaled:
            info = mixers[name]
            if stats is not None:
                static = static_state_scale(stats.get(name, "state_absmax"), d["format"])
            else:
                shape = {"row": (info.num_heads, info.head_k, 1), "head": (info.num_heads, 1, 1)}
                static = torch.ones(shape.get(fmt.granularity, ()))
            mixer.register_buffer("state_static_scale", static.to(next(mixer.parameters(), static).device))
            static = mixer.state_static_scale
        try:
            mixer.state_quantizer = StateQuantizer(d["format"], d["renorm_interval"], static)
        except ValueError as exc:
            raise LaquantError(f"{name}: {exc}") from None
