"""Recipes: load a YAML recipe by name or path, apply ``--set`` overrides, validate every field.

A recipe speaks in roles (projections, gates, state, softmax_attention, keep), never in module
names; an architecture adapter maps roles to modules. ``families`` holds per-model-family defaults
over those sections (:func:`for_family` merges them in once the model is known).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from laquant.errors import LaquantError
from laquant.kernels.common.format_names import ROUNDINGS, SCALED_STATE_FORMATS, STATE_FORMATS
from laquant.recipes import recipe_dir

ANY_NUMBER_OR_NULL = "a number > 0, or null"
ANY_INT_OR_NULL = "an integer > 0, or null"
FRACTION_OR_NULL = "a number in (0, 1], or null"

# section -> field -> (allowed values | description, default)
SCHEMA: dict[str, dict[str, tuple]] = {
    "projections": {
        "format": (("int8", "keep"), "int8"),
        "weight_granularity": (("per_channel", "per_tensor"), "per_channel"),
        "act_granularity": (("per_token", "per_tensor", "per_group"), "per_token"),
        # the projections that close a block (o_proj, out_proj, down_proj: laquant.families.OUTPUT_PROJECTIONS) take
        # this one instead (null: act_granularity). Their inputs come from kernels that see a head or a group of a
        # token, not its whole row: per_group codes need no wait for the row's scale in the GLA decode kernel and
        # SwiGLU (with act_granularity per_token, the 1.37B GLA's graphed B = 64 decode 1.62x -> 1.65x bf16 for
        # +0.05-0.10% perplexity on gla-small, eval/results/mixed_granularity_h200/)
        "output_act_granularity": ((None, "per_token", "per_tensor", "per_group"), None),
        "outlier_threshold": (ANY_NUMBER_OR_NULL, 6.0),
        "outlier_top_k": (ANY_INT_OR_NULL, None),
        # a layer whose outlier channels are more than this fraction of its inputs stays in high precision: the int8
        # layer would save little memory (bf16 columns are twice the bytes) and run a bf16 product beside the int8
        # one (null: no limit)
        "outlier_max_fraction": (FRACTION_OR_NULL, 0.25),
        # what such a layer becomes: kept as it is, or weight-only int8 (per-channel int8 weights, its inputs as they
        # are: no outlier split needed; +0.08% ppl against +0.10% kept on gla-small,
        # eval/results/weight_only_fallback_gla-small_cpu/)
        "outlier_fallback": (("keep", "weight_only"), "keep"),
    },
    "gates": {
        "format": (("int8", "keep"), "int8"),
        "weight_granularity": (("per_channel", "per_tensor"), "per_channel"),
        "scaling": (("per_channel", "per_tensor"), "per_channel"),
        "clamp": ((True, False), True),
    },
    "state": {
        "format": (STATE_FORMATS, "fp32"),
        "renorm_interval": ("an integer >= 0", 1),
        # true: a prefill rounds the state to its format after every 64-token chunk (as if stored
        # between chunks); false: kept in float32 inside one prefill call, stored in the format at its end
        "prefill_roundtrip": ((True, False), False),
        # how a store rounds to a scaled (8- or 4-bit) format: to nearest, or stochastically (unbiased: small
        # decays and updates survive in expectation; random bits from Philox keyed by the cache's seed)
        "rounding": (ROUNDINGS, "nearest"),
    },
    # hybrids: the q/k/v/o projections of the softmax-attention layers (int8: the projections'
    # W8A8 with outlier split and their settings)
    "softmax_attention": {
        "format": (("int8", "keep"), "keep"),
    },
    # hybrids with MoE MLPs: the routed experts' weights in int8, one scale per expert and output channel, the tokens
    # as they are (weight-only; laquant.quant.experts). Applies where the model has experts transformers' way
    "experts": {
        "format": (("int8", "keep"), "keep"),
    },
}
TOP_LEVEL = ("name", "description", *SCHEMA, "keep", "families")
# routers, conv and decay (MoE routers, short convs, A_log / dt_bias / D / slope_rate) are never quantized: a recipe
# may list them in keep, and they are kept either way. experts: int8 where the experts section says so and keep does
# not list them (keep wins)
KEEPABLE = ("embeddings", "norms", "lm_head", "routers", "experts", "conv", "decay")
ALWAYS_KEPT = ("embeddings", "norms")


def available_recipes() -> list[str]:
    return sorted(p.stem for p in recipe_dir().glob("*.yaml"))


def load_recipe(name_or_path: str, overrides: list[str] | None = None) -> dict:
    """A validated recipe dict with every field present (defaults filled in)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = recipe_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        raise LaquantError(f"unknown recipe {name_or_path!r}; available: {', '.join(available_recipes())} "
                           "(or a path to a .yaml file)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise LaquantError(f"recipe {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise LaquantError(f"recipe {path} must be a mapping of sections, got {type(raw).__name__}")
    for item in overrides or []:
        _apply_override(raw, item)
    return validate_recipe(raw, source=str(path))


def _apply_override(recipe: dict, item: str) -> None:
    key, sep, value = item.partition("=")
    if sep and key.strip() == "keep":  # the roles kept in high precision: a YAML list or comma-separated roles
        roles = yaml.safe_load(value)
        recipe["keep"] = [r.strip() for r in roles.split(",") if r.strip()] if isinstance(roles, str) else roles
        return
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise LaquantError(f"--set {item!r}: expected SECTION.FIELD=VALUE, e.g. state.format=fp32, or "
                           f"keep=ROLE,ROLE,... (roles from: {', '.join(KEEPABLE)})")
    section = recipe.setdefault(parts[0], {})
    if not isinstance(section, dict):
        raise LaquantError(f"--set {item!r}: recipe section {parts[0]!r} is not a mapping")
    section[parts[1]] = yaml.safe_load(value)
    for override in (recipe.get("families") or {}).values():  # an explicit --set beats a family default
        if isinstance(override, dict) and isinstance(override.get(parts[0]), dict):
            override[parts[0]].pop(parts[1], None)


def validate_recipe(raw: dict, source: str = "recipe") -> dict:
    unknown = [k for k in raw if k not in TOP_LEVEL]
    if unknown:
        raise LaquantError(f"{source}: unknown key {unknown[0]!r}; allowed keys: {', '.join(TOP_LEVEL)}")
    families = raw.get("families") or {}
    if not isinstance(families, dict):
        raise LaquantError(f"{source}: families must map a model_type to section overrides")
    recipe = {"name": str(raw.get("name", Path(source).stem)), "description": str(raw.get("description", ""))}
    for section, fields in SCHEMA.items():
        given = raw.get(section) or {}
        if not isinstance(given, dict):
            raise LaquantError(f"{source}: {section} must be a mapping of fields ({', '.join(fields)})")
        bad = [k for k in given if k not in fields]
        if bad:
            raise LaquantError(f"{source}: unknown key {section}.{bad[0]}; allowed: {', '.join(fields)}")
        out = {}
        for field, (allowed, default) in fields.items():
            value = given.get(field, default)
            if not _valid(value, allowed):
                shown = allowed if isinstance(allowed, str) else ", ".join(map(str, allowed))
                raise LaquantError(f"{source}: {section}.{field} = {value!r} is not allowed; allowed: {shown}")
            out[field] = value
        recipe[section] = out
    state = recipe["state"]
    if state["rounding"] == "stochastic" and state["format"] not in SCALED_STATE_FORMATS:
        raise LaquantError(f"{source}: state.rounding = stochastic applies to the scaled state formats "
                           f"({', '.join(SCALED_STATE_FORMATS)}), not {state['format']!r}; "
                           "set state.rounding=nearest or a scaled state.format")
    int8_experts = recipe["experts"]["format"] == "int8"
    keep = raw.get("keep", [r for r in KEEPABLE if not (r == "experts" and int8_experts)])
    if not isinstance(keep, list) or any(k not in KEEPABLE for k in keep):
        raise LaquantError(f"{source}: keep must be a list of roles from: {', '.join(KEEPABLE)}; got {keep!r}")
    missing = [r for r in ALWAYS_KEPT if r not in keep]
    if missing:
        raise LaquantError(f"{source}: keep must include {', '.join(missing)}: laquant does not quantize them")
    recipe["keep"] = keep
    recipe["families"] = {}
    for model_type, override in families.items():
        from laquant.families import FAMILIES

        if model_type not in FAMILIES:
            raise LaquantError(f"{source}: families.{model_type}: unknown model_type; known: {', '.join(FAMILIES)}")
        if not isinstance(override, dict) or any(k not in SCHEMA for k in override):
            raise LaquantError(f"{source}: families.{model_type} may only override the sections {', '.join(SCHEMA)}")
        validate_recipe({**_merged(raw, override), "name": recipe["name"]}, f"{source} (families.{model_type})")
        recipe["families"][model_type] = copy.deepcopy(override)
    return recipe


def _merged(raw: dict, override: dict) -> dict:
    out = {k: v for k, v in raw.items() if k != "families"}
    for section, fields in override.items():
        out[section] = {**(raw.get(section) or {}), **(fields or {})}
    return out


def for_family(recipe: dict, model_type: str) -> dict:
    """The recipe as it applies to a ``model_type``: its family's overrides merged in. The result
    has no ``families`` (it is what a checkpoint records)."""
    override = recipe.get("families", {}).get(model_type, {})
    out = copy.deepcopy({k: v for k, v in recipe.items() if k != "families"})
    for section, fields in override.items():
        out[section].update(fields or {})
    out["families"] = {}
    if override:
        out["description"] += f" ({model_type} defaults applied)"
    return out


def _valid(value, allowed) -> bool:
    if allowed == ANY_NUMBER_OR_NULL:
        return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0)
    if allowed == FRACTION_OR_NULL:
        return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1)
    if allowed == ANY_INT_OR_NULL:
        return value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)
    if allowed == "an integer >= 0":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return any(value is a or (type(value) is type(a) and value == a) for a in allowed)


def recipe_to_yaml(recipe: dict) -> str:
    return yaml.safe_dump(copy.deepcopy(recipe), sort_keys=False)
