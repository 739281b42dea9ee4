"""transformers' row-wise ops before W8A8 projections (RMSNorms, SwiGLU), made to write those
projections' int8 codes.

In laquant's own models the kernel that makes a W8A8 GEMM's input (an RMSNorm, the gated norm,
SwiGLU) writes the GEMM's activation codes in the same launch (:meth:`laquant.models.gla.RMSNorm.quantizing`,
:class:`laquant.models.gla.GatedMLP`). A transformers hybrid's decoder layer is transformers' code, so
per-architecture tables teach its modules the same instead of a rewritten layer. :func:`install`
gives

* each decoder layer's norm in :data:`NORM_CONSUMERS` whose class is in :data:`NORM_WEIGHTS` a forward
  that, on the GPU where the projections reading its output are W8A8
  (:func:`~laquant.quant.fused.w8a8_inputs`), runs laquant's fused RMSNorm with their codes and hands
  the codes over with its output (:func:`~laquant.quant.fused.hand_over`): the first projection
  transformers calls then runs the group's one GEMM, the others take their columns;
* each MLP of a class in :data:`SWIGLU_MLPS` a forward that runs ``silu(gate) * up`` as laquant's
  SwiGLU kernel writing ``down_proj``'s codes, where ``down_proj`` is W8A8 on the GPU;
* each attention of a class in :data:`GROUPED_INPUTS`, whose input no norm's codes reach, a forward that
  quantizes that input once and runs its q/k/v projections' one GEMM ahead of transformers' forward;

and :func:`install_final_norm` gives the text model's last norm (before the lm_head, which no recipe quantizes) the
fused norm without codes on the GPU: one launch a step where transformers' formula makes ~8.

The tables hold the classes of qwen3_next, Qwen3.5 (dense and MoE), Kimi Linear, Ling / Ring, MiniMax,
Bamba, Granite 4, Falcon-H1, Nemotron-H, OLMo hybrid, Mamba-2 and Zamba2. Anywhere else (CPU, bf16 projections,
another layer layout or family) the module runs transformers' own forward, unchanged; the class changes (its
name kept), not the module's parameters or names, so checkpoints are untouched.

The fused norm normalizes in float32 exactly as these classes' formulas: the weight applied in float32
with one rounding to the output's dtype, or, for Llama's ``w * x.to(dtype)``, after rounding the
normalized rows (``round_normed``); only the order of the mean's sum differs. SwiGLU rounds as
PyTorch's two ops do.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn as nn

from laquant.kernels.common.dispatch import use_triton
from laquant.quant.modules import QuantGate

# a decoder layer's norm -> where the groups of projections that read its output may sit: (owner, names),
# the first whose owner has all the names (a linear-attention or softmax mixer; a dense MLP or an MoE's shared
# expert). A group whose members are not all W8A8 per-token projections (a kept one, a gate) leaves the norm
# on transformers' forward (w8a8_inputs); a lone member that is a QuantGate of one W8A8 linear is that linear
# (_through_gate).
_QKV = ("q_proj", "k_proj", "v_proj")
NORM_CONSUMERS = {
    "input_layernorm": (("linear_attn", ("in_proj_qkvz",)),  # qwen3_next: q, k, v and z fused
                        ("linear_attn", ("in_proj_qkv", "in_proj_z", "in_proj_b")),  # Qwen3.5: split
                        ("linear_attn", (*_QKV, "b_proj", "g_proj")),  # OLMo hybrid's Gated DeltaNet
                        ("self_attn", (*_QKV, "b_proj", "g_a_proj")),  # Kimi Linear's KDA
                        ("self_attn", (*_QKV, "b_proj", "g_proj")),  # Ling / Ring's KDA
                        ("self_attn", ("q_proj", "kv_a_proj_with_mqa")),  # MLA (Kimi Linear, Ling / Ring)
                        ("self_attn", ("qkv_proj", "output_gate")),  # MiniMax's Lightning attention
                        ("self_attn", _QKV),
                        ("mamba", ("in_proj",))),  # Bamba's and Granite 4's Mamba2 layers
    "post_attention_layernorm": (("mlp", ("gate_proj", "up_proj")), ("mlp.shared_expert", ("gate_proj", "up_proj")),
                                 ("mlp.shared_experts", ("gate_proj", "up_proj")),  # Kimi Linear, Ling / Ring
                                 ("shared_mlp", ("input_linear",))),  # Granite 4 (gate and up in one linear)
    "pre_ff_layernorm": (("feed_forward", ("gate_proj", "up_proj")),  # Bamba, Falcon-H1
                         ("feed_forward", ("gate_up_proj",))),  # Zamba2's shared block (gate and up in one linear)
    "norm": (("mixer", _QKV), ("mixer", ("up_proj",)), ("mixer.shared_experts", ("up_proj",)),  # Nemotron-H's block
             ("mixer", ("in_proj",))),  # Nemotron-H's and Mamba-2's Mamba2 blocks
}
# A Mamba2 mixer's in_proj, once calibrated, is a QuantGate (of its dt channels) around the W8A8 linear: the norm
# writes that linear's codes (_through_gate).
# decoder layer class -> the decoder layers inside it, whose norms the tables treat as a layer's (Zamba2's hybrid layer:
# the shared attention block, then a Mamba layer)
NESTED_LAYERS = {"Zamba2HybridLayer": ("shared_transformer", "mamba_decoder")}
# decoder layer class -> its norms whose output no projection reads as it is
UNPROJECTED_NORMS = {
    "OlmoHybridAttentionDecoderLayer": ("post_attention_layernorm",),  # post-norm: added to the residual
    "FalconH1DecoderLayer": ("input_layernorm",),  # attention reads it times attention_in_multiplier
}


def _weight(norm: nn.Module) -> torch.Tensor:
    return norm.weight.float()


def _one_plus_weight(norm: nn.Module) -> torch.Tensor:
    return 1.0 + norm.weight.float()


# norm class -> (the float32 weight its formula multiplies by, the name of its epsilon, whether the normalized
# rows are rounded to the input's dtype before the weight multiplies them: Llama's ``w * x.to(dtype)``, whose
# product is in the weight's dtype, so the fused norm runs only where that is the input's)
NORM_WEIGHTS = {
    # (x * (1 + w)).to(dtype) in float32: qwen3_next, Qwen3.5
    **{name: (_one_plus_weight, "eps", False) for name in ("Qwen3NextRMSNorm", "Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm")},
    # (w * x).to(dtype) in float32: Nemotron-H, OLMo hybrid
    **{name: (_weight, "variance_epsilon", False) for name in ("NemotronHRMSNorm", "OlmoHybridRMSNorm")},
    # w * x.to(dtype): Llama's
    **{name: (_weight, "variance_epsilon", True) for name in (
        "KimiLinearRMSNorm", "BailingHybridRMSNorm", "MiniMaxRMSNorm", "BambaRMSNorm", "GraniteMoeHybridRMSNorm",
        "FalconH1RMSNorm", "Mamba2RMSNorm", "Zamba2RMSNorm")},
}

class GatedNorm(NamedTuple):
    """A linear mixer's output norm ``rmsnorm(x) * w * act(g)`` as laquant's gated norm kernel takes it (a row in
    :data:`GATED_NORMS`)."""

    eps_name: str  # the attribute holding its epsilon
    activation: str  # the gate's: silu or sigmoid


# gated norm class -> its formula: laquant's gated norm kernel, weight applied in float32, replaces it. qwen3_next's,
# Qwen3.5's and OLMo hybrid's (silu) before a W8A8 out_proj (GatedDeltaNetMixer.norm_and_out), where transformers
# rounds the normalized rows and ``w * x`` to the model's dtype first, roundings more; Kimi Delta Attention's (sigmoid;
# Kimi Linear, Ling / Ring), float32 throughout as transformers computes it, before o_proj whatever it is
# (KimiDeltaAttentionMixer.norm_and_out); MiniMax's Lightning attention output norm, a plain RMSNorm the mixer
# multiplies by the sigmoid of its output gate (LightningMixer.norm_and_out; transformers rounds twice more)
GATED_NORMS = {
    **{name: GatedNorm("variance_epsilon", "silu") for name in (
        "Qwen3NextRMSNormGated", "Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated", "OlmoHybridRMSNormGated")},
    **{name: GatedNorm("variance_epsilon", "sigmoid") for name in (
        "KimiLinearRMSNormGated", "BailingHybridRMSNormGated", "MiniMaxRMSNorm")},
}


class MambaGatedNorm(NamedTuple):
    """A grouped gated norm's formula as laquant's norm kernel takes it (a row in :data:`MAMBA_GATED_NORMS`)."""

    eps_name: str  # the attribute holding its epsilon
    gate_first: Callable[[nn.Module], bool]  # whether silu(z) multiplies before the norm (of the module)
    round_normed: bool  # whether the normalized rows are rounded to the input's dtype before the weight


# Mamba2's grouped gated norm class -> its formula: laquant's norm kernel (a weight per group) replaces it before
# out_proj (Mamba2Mixer.norm_and_out), the same formula with float32 rounding of its own (the mean's summation
# order, silu, rsqrt). Mamba2's: ``w * rmsnorm_per_group(x * silu(z)).to(dtype)``, the weight in its dtype;
# Falcon-H1's: float32 throughout and one rounding, the gate before the norm or after it (``norm_before_gate``)
MAMBA_GATED_NORMS = {
    **{name: MambaGatedNorm("variance_epsilon", lambda norm: True, True) for name in (
        "BambaRMSNormGated", "NemotronHRMSNormGated", "GraniteMoeHybridRMSNormGated", "Zamba2RMSNormGated",
        "MambaRMSNormGated", "Mamba2RMSNormGated")},  # Mamba-2's: renamed in transformers 5.25
    "FalconH1RMSNormGated": MambaGatedNorm("variance_epsilon", lambda norm: not norm.norm_before_gate, False),
}


def mamba_norm_group(norm: nn.Module, width: int) -> int:
    """The width of a group of a grouped gated norm over rows of ``width``: Mamba2's norms name it
    (``group_size``; before the groups, transformers' normalized the whole row), Falcon-H1's their number."""
    return getattr(norm, "group_size", None) or width // getattr(norm, "n_groups", 1)


# MLP class -> its projections' and activation's names (gate, up, down, act): the SwiGLU ``down(act(gate(x)) *
# up(x))`` whose product laquant's kernel makes with down's codes, where ``act`` is one of SILU_CLASSES
# (``F.silu``); up None: the gate projection makes both, the gate its first half (``chunk(2)``)
SWIGLU_MLPS = {
    **{name: ("gate_proj", "up_proj", "down_proj", "act_fn") for name in (
        "Qwen3NextMLP", "Qwen3_5MLP", "Qwen3_5MoeMLP", "KimiLinearMLP", "BailingHybridMLP", "BambaMLP", "OlmoHybridMLP")},
    "GraniteMoeHybridMLP": ("input_linear", None, "output_linear", "activation"),  # Granite 4's shared MLP
    "FalconH1MLP": ("gate_proj", "up_proj", "down_proj", "act_fn"),  # with muP multipliers (MLP_MULTIPLIERS)
}
# MLP class -> the names of its scalar multipliers: of the gate projection's output before the activation, and of
# the MLP's output (Falcon-H1's ``mlp_multipliers``); applied as transformers applies them, the SwiGLU kernel between
MLP_MULTIPLIERS = {"FalconH1MLP": ("gate_multiplier", "down_multiplier")}
SWIGLU_PATHS = ("mlp", "mlp.shared_expert", "mlp.shared_experts", "feed_forward", "shared_mlp")
SILU_CLASSES = ("SiLU", "SiLUActivation")  # torch's, transformers' (its forward is F.silu)

# attention class -> the projections that read its ``hidden_states`` argument where no norm's codes reach them
# (Falcon-H1's layer multiplies the norm's output by attention_in_multiplier first): on the GPU where they run as
# one packed GEMM, the attention quantizes hidden_states once and runs that GEMM before transformers' forward calls
# them one by one (:func:`~laquant.quant.fused.run_group_ahead`), instead of three quantization passes and GEMMs
GROUPED_INPUTS = {"FalconH1Attention": _QKV}
GROUPED_INPUT_PATHS = ("self_attn",)


def _submodule(layer: nn.Module, path: str) -> nn.Module | None:
    try:
        return layer.get_submodule(path)
    except AttributeError:
        return None


def _on_norm_kernel(norm: nn.Module, x: torch.Tensor) -> bool:
    """Whether laquant's fused RMSNorm can compute ``norm`` (a class in :data:`NORM_WEIGHTS`) of ``x``: on the GPU,
    rows it takes, and for Llama's ``w * x.to(dtype)`` a weight in x's dtype (the product's dtype is the weight's)."""
    from laquant.kernels.rowwise.fused import MAX_ROW

    round_normed = NORM_WEIGHTS[original_class(norm).__name__][2]
    return use_triton(x) and x.shape[-1] <= MAX_ROW and not (round_normed and norm.weight.dtype != x.dtype)


class _QuantizingNorm:
    """Mixed into a norm's class by :func:`install` (the original class next in the MRO)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, eps_name, round_normed = NORM_WEIGHTS[self._laquant_base.__name__]
        if _on_norm_kernel(self, x):
            from laquant.quant.fused import hand_over, w8a8_inputs

            for owner, names in self.__dict__["_laquant_consumers"]:
                owner, names = _through_gate(owner, names)
                packed = w8a8_inputs(owner, names, x, groups=True)
                if packed is not None:
                    from laquant.kernels.rowwise.fused import rms_norm_triton

                    out, _, codes = rms_norm_triton(x, formula_weight(self), getattr(self, eps_name), packed=packed,
                                                    round_normed=round_normed)
                    return hand_over(out, codes, owner, names, packed)
        return super().forward(x)


class _FusedFinalNorm:
    """Mixed into a text model's last norm (before the lm_head) by :func:`install_final_norm`: on the GPU, laquant's
    fused RMSNorm in one launch, where transformers' formula is ~8 (the float32 cast, the square, mean, epsilon,
    rsqrt, the products and the cast back), every decode step's. The same formula (:data:`NORM_WEIGHTS`), only the
    order of the mean's sum differing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _on_norm_kernel(self, x):
            from laquant.kernels.rowwise.fused import rms_norm_triton

            _, eps_name, round_normed = NORM_WEIGHTS[self._laquant_base.__name__]
            return rms_norm_triton(x, formula_weight(self), getattr(self, eps_name), round_normed=round_normed)[0]
        return super().forward(x)


FINAL_NORMS = ("norm", "norm_f", "final_layernorm")  # where a text model keeps its last norm


def install_final_norm(text_model: nn.Module) -> int:
    """Give ``text_model``'s last norm (the first of :data:`FINAL_NORMS` it has), of a class in :data:`NORM_WEIGHTS`,
    the one-launch forward; returns 1 if it did. Idempotent."""
    norm = next((m for name in FINAL_NORMS if isinstance(m := getattr(text_model, name, None), nn.Module)), None)
    return mix_into([norm], _FusedFinalNorm, NORM_WEIGHTS)


def _through_gate(owner: nn.Module, names: tuple[str, ...]) -> tuple[nn.Module, tuple[str, ...]]:
    """The consumer ``owner.names`` as the GEMM sees it: a lone member that calibration made a
    :class:`~laquant.quant.modules.QuantGate` of one linear (a Mamba2 in_proj, its dt channels treated after the
    linear) is that linear, ``gate.0``, whose output the gate then treats."""
    if len(names) == 1:
        member = owner._modules.get(names[0])
        if isinstance(member, QuantGate) and len(member) == 1:
            return member, ("0",)
    return owner, names


def formula_weight(norm: nn.Module) -> torch.Tensor:
    """The float32 weight of the formula of ``norm`` (a class in :data:`NORM_WEIGHTS`), made again only
    when the parameter changes."""
    w = norm.weight
    key = (w.data_ptr(), w._version, w.device)
    cached = norm.__dict__.get("_laquant_kernel_weight")
    if cached is None or cached[0] != key:
        cached = (key, NORM_WEIGHTS[original_class(norm).__name__][0](norm).contiguous())
        norm.__dict__["_laquant_kernel_weight"] = cached
    return cached[1]


class _QuantizingSwiGLU:
    """Mixed into an MLP's class by :func:`install` (the original class next in the MRO)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_name, up_name, down_name, act_name = SWIGLU_MLPS[self._laquant_base.__name__]
        if use_triton(x) and type(getattr(self, act_name)).__name__ in SILU_CLASSES:
            from laquant.quant.fused import glu_w8a8, project, w8a8_inputs

            if w8a8_inputs(self, (down_name,), x, groups=True) is not None:
                if up_name is None:  # both halves of one projection (column slices: the kernel reads them as they are)
                    gate, up = project(self, (gate_name,), x)[0].chunk(2, dim=-1)
                else:  # x's handed-over codes serve both, in one GEMM
                    gate, up = project(self, (gate_name, up_name), x)
                gate_multiplier, out_multiplier = MLP_MULTIPLIERS.get(self._laquant_base.__name__, (None, None))
                if gate_multiplier is not None:
                    gate = gate * getattr(self, gate_multiplier)
                out = glu_w8a8(self, down_name, gate, up)
                return out if out_multiplier is None else out * getattr(self, out_multiplier)
        return super().forward(x)


class _GroupedInputs:
    """Mixed into an attention's class by :func:`install` (the original class next in the MRO)."""

    def forward(self, *args, **kwargs):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        if use_triton(x):
            from laquant.quant.fused import run_group_ahead

            run_group_ahead(self, GROUPED_INPUTS[self._laquant_base.__name__], x)
        return super().forward(*args, **kwargs)


_CLASSES: dict[tuple[type, type], type] = {}


def mixin_class(mixin: type, cls: type) -> type:
    """``cls`` with ``mixin``'s methods first (its name kept; the original as ``_laquant_base``), one class
    per pair."""
    if (mixin, cls) not in _CLASSES:
        _CLASSES[mixin, cls] = type(cls.__name__, (mixin, cls), {"__module__": cls.__module__,
                                                                 "__qualname__": cls.__qualname__,
                                                                 "_laquant_base": cls})
    return _CLASSES[mixin, cls]


def original_class(module: nn.Module) -> type:
    """The module's class before :func:`mixin_class` changed it."""
    return getattr(module, "_laquant_base", type(module))


def mix_into(modules, mixin: type, class_names) -> int:
    """Give each of ``modules`` (None skipped) whose original class is named in ``class_names``
    ``mixin``'s methods first (:func:`mixin_class`); returns how many. Idempotent; the parameters and
    their names are untouched."""
    count = 0
    for module in modules:
        if module is not None and original_class(module).__name__ in class_names:
            module.__class__ = mixin_class(mixin, original_class(module))
            count += 1
    return count


def _with_nested(layers) -> list[nn.Module]:
    """``layers`` and the decoder layers inside them (:data:`NESTED_LAYERS`), each once (a block shared by several
    layers is one module)."""
    out = []
    for layer in layers:
        for module in (layer, *(_submodule(layer, p) for p in NESTED_LAYERS.get(original_class(layer).__name__, ()))):
            if module is not None and not any(module is seen for seen in out):
                out.append(module)
    return out


def install(layers) -> int:
    """Give the norms of ``layers`` (a model's decoder layers) listed in :data:`NORM_CONSUMERS`, of a
    class in :data:`NORM_WEIGHTS`, the quantizing forward, pointed at the projections after them in
    their layer, the layers' MLPs (or MoE shared experts) of a class in :data:`SWIGLU_MLPS` the
    SwiGLU one, and their attentions of a class in :data:`GROUPED_INPUTS` the one running their projections'
    GEMM ahead; returns how many modules. Idempotent."""
    count = 0
    for layer in _with_nested(layers):
        unprojected = UNPROJECTED_NORMS.get(type(layer).__name__, ())
        for norm_name, candidates in NORM_CONSUMERS.items():
            norm = getattr(layer, norm_name, None) if norm_name not in unprojected else None
            if norm is None or original_class(norm).__name__ not in NORM_WEIGHTS:
                continue
            consumers = [(owner, names) for path, names in candidates
                         if (owner := _submodule(layer, path)) is not None
                         and all(isinstance(getattr(owner, n, None), nn.Module) for n in names)][:1]
            if not consumers:
                continue
            norm.__class__ = mixin_class(_QuantizingNorm, original_class(norm))
            norm.__dict__["_laquant_consumers"] = consumers
            count += 1
        for path in SWIGLU_PATHS:
            mlp = _submodule(layer, path)
            if mlp is not None and original_class(mlp).__name__ in SWIGLU_MLPS:
                mlp.__class__ = mixin_class(_QuantizingSwiGLU, original_class(mlp))
                count += 1
        count += mix_into([_submodule(layer, path) for path in GROUPED_INPUT_PATHS], _GroupedInputs, GROUPED_INPUTS)
    return count
