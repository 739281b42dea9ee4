"""A laquant-quantized transformers hybrid written as a compressed-tensors W8A8 int8 checkpoint:
the form transformers loads without laquant (``AutoModelForCausalLM.from_pretrained``, or
``AutoModelForImageTextToText`` for the vision-language models, with ``compressed-tensors`` installed) and
vLLM's compressed-tensors loader serves. A vision-language model's vision tower (never quantized by laquant) is
written as the checkpoint holds it, its linear layers in ``ignore``.

What laquant's projections are, compressed-tensors' ``W8A8`` preset (as llm-compressor writes it)
expresses exactly: int8 weights, symmetric, one static float32 scale per output channel
(``weight``, ``weight_scale``), and int8 activations quantized per token at run time by the
engine. The int8 codes and scales are laquant's own, copied as they are. The rest is mapped so:

* **outlier columns** (laquant's LLM.int8-style split keeps some input channels in bf16): the
  format has no split. ``outliers="requantize"`` (the default) rebuilds the full weight (int8 part
  dequantized, outlier columns as they are) and quantizes it per channel again, through laquant's
  one quantizer; ``outliers="bf16"`` keeps such layers dense (their weight dequantized, in bf16, in ``ignore``).
* **gates** (int8 weights, calibrated clamp and int8 rounding of the logits): no such treatment
  exists in the format; a gate projection of its own is written dense (bf16) with its int8 weights
  dequantized (weight-only int8 is what laquant ran) and listed in ``ignore``; the clamp and logit rounding are dropped. A gate that is a slice of a W8A8
  projection (Mamba2's ``dt`` channels of ``in_proj``) keeps the projection's int8 form and loses
  only the logit treatment.
* **MoE experts** (laquant's int8 weights, weight-only): this export's scheme is W8A8 for ``Linear`` layers; the
  experts are written dense (their int8 weights dequantized, in transformers' 3-D layout) and their modules listed in
  ``ignore``.
* **the recurrent state format** is an engine option, not a tensor (vLLM's
  ``--mamba-ssm-cache-dtype``): :func:`engine_state_dtype` says which.
* projections that vLLM runs as one fused layer (q/k/v, gate/up, Qwen3.5's ``in_proj_qkv`` +
  ``in_proj_z`` and ``in_proj_b`` + ``in_proj_a``) must share one scheme there: if one member is
  dense, all are.

Everything that is not a quantized projection (embeddings, norms, conv, decay parameters, routers,
expert weights the recipe kept, lm_head) is written as the checkpoint holds it; laquant-only tensors (outlier
indices, logit bounds, static state scales) are not written.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from laquant.checkpoint import storage_tensor
from laquant.decisions import Decisions
from laquant.errors import LaquantError
from laquant.export_options import OUTLIER_POLICIES, check_exportable  # noqa: F401  (re-exported)
from laquant.families import get_family
from laquant.kernels.common.numerics import quantize_int8
from laquant.quant.experts import QuantExperts
from laquant.quant.modules import QuantGate, QuantLinear

QUANT_METHOD = "compressed-tensors"
FORMAT = "int-quantized"
# compressed-tensors' "W8A8" preset scheme (preset_name_to_scheme("W8A8", ["Linear"]).model_dump()):
# int8 symmetric per-channel static weights, int8 symmetric per-token dynamic activations
W8A8_SCHEME = {
    "targets": ["Linear"],
    "weights": {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None, "strategy": "channel",
                "dynamic": False},
    "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None,
                          "strategy": "token", "dynamic": True},
    "output_activations": None,
    "format": None,
}
# sibling projections vLLM loads into one fused layer (its models' packed_modules_mapping)
VLLM_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("in_proj_qkv", "in_proj_z"),
              ("in_proj_b", "in_proj_a"))
# laquant's state format -> the state dtype to ask the engine for (vLLM stores float32, float16 or
# bfloat16 states; none of 8 bits): the format itself where it has one, else bfloat16, the smallest,
# which is finer than laquant's 8-bit formats (7 mantissa bits against e4m3's 3, int8's 7 over a row's range)
ENGINE_STATE_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass
class Exported:
    """What the export did, module by module (names as in the checkpoint)."""

    model_type: str
    int8: list[str] = field(default_factory=list)  # W8A8 int8, laquant's codes and scales
    requantized: dict[str, int] = field(default_factory=dict)  # W8A8 after folding N outlier columns in
    dense: dict[str, str] = field(default_factory=dict)  # quantized by laquant, written dense: why
    gate_treatment_dropped: list[str] = field(default_factory=list)  # logit clamp / rounding not carried
    ignore: list[str] = field(default_factory=list)
    state_formats: dict[str, int] = field(default_factory=dict)  # laquant state format -> layers

    @property
    def engine_state_dtype(self) -> str:
        return engine_state_dtype(self.state_formats)

    @property
    def auto_class(self) -> str:
        """The transformers Auto class that loads the folder."""
        return get_family(self.model_type).auto_class


def engine_state_dtype(state_formats) -> str:
    """The ``--mamba-ssm-cache-dtype`` closest to laquant's state formats (float32 if any layer
    kept float32, bfloat16 for bf16 and the 8- and 4-bit formats vLLM does not have)."""
    dtypes = {ENGINE_STATE_DTYPE.get(f, "bfloat16") for f in state_formats} or {"float32"}
    return "float32" if "float32" in dtypes else "bfloat16"


def compressed_tensors_config(ignore: list[str]) -> dict:
    """``config.json``'s ``quantization_config``, as llm-compressor writes its W8A8 preset."""
    return {"config_groups": {"group_0": json.loads(json.dumps(W8A8_SCHEME))}, "format": FORMAT,
            "global_compression_ratio": None, "ignore": list(ignore), "kv_cache_scheme": None,
            "quant_method": QUANT_METHOD, "quantization_status": "compressed", "sparsity_config": {},
            "transform_config": {}}


def _reference_model(model):
    """transformers' own model of ``model``'s config (its family's Auto class: the causal LM, or the
    vision-language model whose language model laquant quantized), on the meta device: its module names,
    Linear layers and state-dict keys are what the checkpoint must hold."""
    family = get_family(model.config.model_type)
    with torch.device("meta"):
        return family.from_config(family.config(_plain_config(model)))


def _plain_config(model) -> dict:
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    return cfg


def _dense(q: QuantLinear | nn.Linear) -> dict[str, torch.Tensor]:
    out = {"weight": q.dequantized_weight() if isinstance(q, QuantLinear) else q.weight.detach()}
    if q.bias is not None:
        out["bias"] = q.bias.detach()
    return out


def _int8(q: QuantLinear, requantize: bool) -> dict[str, torch.Tensor]:
    if requantize:  # the whole weight, outlier columns included, through laquant's one quantizer
        weight, scale = quantize_int8(q.dequantized_weight(), dim=-1)
    else:
        weight = q.qweight[:, :q.n_main]
        scale = q.weight_scale.float().expand(q.out_features, 1)  # a per-tensor scale, repeated per channel
    out = {"weight": weight.contiguous(), "weight_scale": scale.reshape(-1, 1).float().contiguous()}
    if q.bias is not None:
        out["bias"] = q.bias.detach()
    return out


def _quantized_modules(model, decisions: Decisions) -> tuple[dict[str, nn.Module], dict[str, str], list[str]]:
    """The linears of every module laquant quantized, by checkpoint module name; those to write
    dense (name -> why: weight-only gates and projections, a gate whose projection stayed bf16); and the gates whose
    logit treatment is dropped."""
    linears, dense, dropped = {}, {}, []
    for name in dict.fromkeys([*decisions.projections, *decisions.gates]):  # Mamba2's in_proj is both
        module = model.get_submodule(name)
        if isinstance(module, QuantGate):
            dropped.append(name)
            inner = list(module)
            if len(inner) != 1:
                raise LaquantError(f"{name}: a gate of {len(inner)} linears (a low-rank gate) has no single layer "
                                   "to write in a transformers checkpoint")
            module = inner[0]
            if isinstance(module, nn.Linear):
                dense[name] = "gate (its projection is not quantized; the logit clamp and rounding are not carried)"
                linears[name] = module
                continue
            if isinstance(module, QuantLinear) and module.act_granularity == "none":
                dense[name] = "gate (int8 weights, dequantized; the logit clamp and rounding are not carried)"
        if not isinstance(module, QuantLinear):
            raise LaquantError(f"{name} is a {type(module).__name__}, not one of laquant's quantized linears: "
                               "is the model calibrated (laquant.load of a laquant checkpoint)?")
        if module.act_granularity == "none" and name not in dense:
            dense[name] = "weight-only int8 (the recipe's outlier_fallback), dequantized: this format's int8 is W8A8"
        if module.act_granularity in ("per_tensor", "per_group"):
            kind = module.act_granularity.replace("_", "-")
            raise LaquantError(f"{name}: {kind} activation scales (act_granularity {module.act_granularity}) have "
                               "no int8 form an engine runs (vLLM's int8 W8A8 quantizes activations per token); "
                               "calibrate with --set projections.act_granularity=per_token (and without "
                               "projections.output_act_granularity) for this export")
        linears[name] = module
    return linears, dense, dropped


def _fused_siblings(name: str) -> list[str]:
    parent, _, leaf = name.rpartition(".")
    for group in VLLM_FUSED:
        if leaf in group:
            return [f"{parent}.{member}" for member in group]
    return [name]


def plan_export(model, decisions: Decisions | dict, outliers: str = "requantize") -> tuple[Exported, dict]:
    """Which module is written how: ``(summary, {module name: its tensors})`` for every module
    laquant quantized."""
    if outliers not in OUTLIER_POLICIES:
        raise LaquantError(f"unknown outlier policy {outliers!r}; choose from {', '.join(OUTLIER_POLICIES)}")
    if not isinstance(decisions, Decisions):
        decisions = Decisions.from_dict(decisions)
    check_exportable(model.config.model_type, "the model")
    linears, dense, dropped = _quantized_modules(model, decisions)
    summary = Exported(model.config.model_type, gate_treatment_dropped=dropped,
                       state_formats=dict(Counter(d.format for d in decisions.state.values())))
    if "lm_head" in linears:
        dense["lm_head"] = "lm_head (engines keep it unquantized in this format; laquant's int8 weights dequantized)"
    for name, q in linears.items():
        if name not in dense and q.n_outliers and outliers == "bf16":
            dense[name] = f"{q.n_outliers} outlier input channels (outliers=bf16: the layer stays dense)"
    changed = True
    while changed:  # vLLM fuses some siblings into one layer with one scheme: dense spreads to them
        changed = False
        for name in list(linears):
            if name in dense:
                continue
            for sibling in _fused_siblings(name):
                if sibling != name and (sibling in dense or (sibling not in linears and _has_linear(model, sibling))):
                    dense[name] = f"served fused with {sibling.rpartition('.')[2]}, which is not int8"
                    changed = True
                    break
    tensors = {}
    for name, q in linears.items():
        if name in dense:
            tensors[name] = _dense(q)
        else:
            requantize = q.n_outliers > 0
            tensors[name] = _int8(q, requantize)
            if requantize:
                summary.requantized[name] = q.n_outliers
            summary.int8.append(name)
    summary.dense = {n: dense[n] for n in linears if n in dense}
    for name in decisions.experts:
        experts = model.get_submodule(name)
        if not isinstance(experts, QuantExperts):
            raise LaquantError(f"{name} is a {type(experts).__name__}, not laquant's int8 experts: is the model "
                               "calibrated (laquant.load of a laquant checkpoint)?")
        w_in, w_out = experts.dequantized()
        tensors[name] = {"gate_up_proj" if experts.gated else "up_proj": w_in, "down_proj": w_out}
        summary.dense[name] = "MoE experts (int8 weights, weight-only: dequantized; this export's int8 is W8A8 Linear)"
    return summary, tensors


def _has_linear(model, name: str) -> bool:
    try:
        return isinstance(model.get_submodule(name), nn.Linear)
    except AttributeError:
        return False


def write_compressed_tensors(model, decisions: Decisions | dict, folder: Path, tokenizer=None,
                             outliers: str = "requantize", storage_dtype: torch.dtype = torch.bfloat16) -> Exported:
    """Write ``model.safetensors`` and ``config.json`` (and the tokenizer) of the compressed-tensors
    form of the calibrated ``model`` into the existing ``folder``."""
    from safetensors.torch import save_file

    summary, quantized = plan_export(model, decisions, outliers)
    reference = _reference_model(model)
    expected = reference.state_dict()
    linear_names = [n for n, m in reference.named_modules() if isinstance(m, nn.Linear)]
    source = model.state_dict()
    state = {}
    for key, ref in expected.items():
        module, _, leaf = key.rpartition(".")
        if module in quantized:
            if leaf not in quantized[module]:
                raise LaquantError(f"{key}: transformers' {model.config.model_type} has it, laquant's quantized "
                                   f"{module} has no such tensor")
            continue
        if key not in source:
            raise LaquantError(f"{key} (transformers' {model.config.model_type}) is not in the laquant model; "
                               "its layout differs from this transformers version's")
        if tuple(source[key].shape) != tuple(ref.shape):
            raise LaquantError(f"{key}: shape {tuple(source[key].shape)} in the laquant model, "
                               f"{tuple(ref.shape)} in transformers' {model.config.model_type}")
        state[key] = storage_tensor(source[key], storage_dtype).clone()  # tied weights: one tensor per name
    for module, tensors in quantized.items():
        for leaf, t in tensors.items():
            key = f"{module}.{leaf}"
            want = expected.get(key)
            if leaf == "weight" and want is not None and tuple(t.shape) != tuple(want.shape):
                raise LaquantError(f"{key}: shape {tuple(t.shape)}, transformers expects {tuple(want.shape)}")
            keep = t.dtype == torch.int8 or leaf == "weight_scale"  # codes and float32 scales as they are
            # dense layers in the serving dtype (a dequantized weight rounds by 2**-9 relative: far below
            # its int8 rounding; float32 would make them larger than the unquantized model's)
            state[key] = (t if keep else t.to(storage_dtype)).detach().cpu().contiguous().clone()
    # every Linear that is not int8 is ignored; MoE expert blocks by name too (vLLM's fused MoE layer
    # takes the Linear scheme unless its prefix is ignored)
    int8 = set(summary.int8)
    summary.ignore = [n for n in linear_names if n not in int8]
    summary.ignore += [n for n, m in reference.named_modules() if n.endswith(".experts") and n not in int8]
    save_file(state, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
    (Path(folder) / "config.json").write_text(json.dumps(_config(model, reference, summary.ignore, storage_dtype),
                                                         indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return summary


def _config(model, reference, ignore: list[str], storage_dtype: torch.dtype) -> dict:
    config = _plain_config(model)
    config["architectures"] = [type(reference).__name__]
    config["dtype"] = str(storage_dtype).removeprefix("torch.")  # the serving dtype; scales stay float32
    config["quantization_config"] = compressed_tensors_config(ignore)
    encode = getattr(model.config, "_encode_special_floats", None)  # inf/nan as transformers writes them
    return encode(config) if encode else config


def serving_markdown(summary: Exported, source: str, recipe_name: str, perplexity_table: str | None = None,
                     perplexity_note: str = "") -> str:
    """``serving.md``: how to serve the folder, what carried over from laquant's form and what did not."""
    state = summary.engine_state_dtype
    formats = ", ".join(f"`{f}` ({n} layers)" for f, n in summary.state_formats.items()) or "none"
    lines = [
        "# Serving this checkpoint", "",
        f"compressed-tensors W8A8 int8 (`quant_method: compressed-tensors`, `format: {FORMAT}`), exported by laquant "
        f"from `{source}` (recipe `{recipe_name}`, model_type `{summary.model_type}`).", "",
        "## Run it", "",
        "```",
        f"vllm serve THIS_FOLDER --dtype bfloat16 --mamba-ssm-cache-dtype {state}",
        "```", "",
        "vLLM reads the quantization from `config.json`. In Python, without laquant "
        "(`pip install compressed-tensors`):", "",
        "```python",
        f"from transformers import {summary.auto_class}",
        f"model = {summary.auto_class}.from_pretrained(\"THIS_FOLDER\")",
        "```", "",
        "## What carried over", "",
        f"- **{len(summary.int8)} projections as W8A8 int8**: int8 weights with one float32 scale per output channel, "
        "activations int8 per token, quantized by the engine at run time. Where laquant had no outlier columns, "
        "the weight codes and scales are laquant's own, bit for bit. vLLM's int8 kernel quantizes activations on "
        "laquant's grid (absmax / 127, codes -127..127, int32 sums); transformers' CPU path fake-quantizes them "
        "with compressed-tensors' grid (absmax / 127.5, codes -128..127), a second draw of the same rounding noise.",
    ]
    if summary.requantized:
        lines.append(f"- **{len(summary.requantized)} of them had outlier input channels**, which laquant kept in "
                     "bf16 beside the int8 columns (an LLM.int8-style split this format cannot express). They are "
                     "folded in: the full weight (dequantized int8 columns and the bf16 outlier columns) is quantized "
                     "per output channel again, and the engine quantizes those input channels per token with the rest. "
                     "The perplexity below includes what that costs.")
        lines += ["", "| module | outlier channels folded in |", "|---|---|"]
        lines += [f"| `{n}` | {k} |" for n, k in summary.requantized.items()]
    lines += ["", "## What did not carry over", ""]
    if summary.dense:
        lines += ["Quantized by laquant, written dense (in `ignore`):", "", "| module | why |", "|---|---|"]
        lines += [f"| `{n}` | {why} |" for n, why in summary.dense.items()]
        lines.append("")
    if summary.gate_treatment_dropped:
        lines.append(f"- **Gate logit treatment** ({len(summary.gate_treatment_dropped)} gates): laquant clamped the "
                     "gate logits to their calibrated range and rounded them to int8 with static per-channel scales; "
                     "the format has no such step, so the engine computes the gates' logits unclamped.")
    lines.append(f"- **Recurrent state format**: laquant stored the state as {formats}. The state is no tensor in "
                 "the checkpoint but an engine setting; vLLM keeps it in float32, float16 or bfloat16 "
                 f"(`--mamba-ssm-cache-dtype`, no 8-bit option): pass `{state}`"
                 + (" (finer than laquant's 8- and 4-bit formats, at two or four times their memory)."
                    if state == "bfloat16" else "."))
    lines.append("- Never quantized by laquant, written as they were and listed in `ignore` where they are linear "
                 "layers: embeddings, norms, MoE routers, short convs, decay parameters (and lm_head and MoE expert "
                 "weights where the recipe kept them).")
    lines.append(f"- `ignore` lists {len(summary.ignore)} modules by name.")
    if perplexity_table is not None:
        lines += ["", "## Perplexity", "", perplexity_note, "", perplexity_table]
    return "\n".join(lines) + "\n"


def export_compressed_tensors(model, out: str | Path, tokenizer=None, outliers: str = "requantize",
                              overwrite: bool = False, source: str = "a calibrated model") -> Exported:
    """Write the compressed-tensors form of a model that ``laquant.calibrate`` quantized (or
    ``laquant.load`` loaded) to ``out`` (through a temporary folder: a failure leaves nothing):
    ``model.safetensors``, ``config.json``, the tokenizer and ``serving.md``."""
    from laquant.checkpoint import StagingDir

    qcfg = getattr(model.config, "quantization_config", None)
    decisions = getattr(qcfg, "decisions", None)
    if decisions is None:
        raise LaquantError("the model carries no laquant quantization decisions: calibrate it (laquant.calibrate) "
                           "or load a laquant checkpoint (laquant.load) first")
    check_exportable(model.config.model_type, "the model")
    with StagingDir(Path(out), overwrite) as tmp:
        summary = write_compressed_tensors(model, decisions, tmp, tokenizer, outliers)
        (tmp / "serving.md").write_text(serving_markdown(summary, source, qcfg.recipe.get("name", "?")))
    return summary
