"""MoE experts with int8 weights, in place of transformers' experts modules.

transformers 5 holds a MoE layer's routed experts as one module of 3-D weights (``gate_up_proj [E, 2I, H]`` or
``up_proj [E, I, H]``, and ``down_proj [E, H, I]``) called as ``experts(hidden_states, top_k_index,
top_k_weights)``. :class:`QuantExperts` takes its place with int8 codes and a float32 scale per expert and output
channel (weight-only: the tokens stay in the model's dtype), and computes what it computes through
:func:`laquant.kernels.moe.reference.int8_experts` (the CPU path) or its Triton twin (CUDA). In MoE models the
experts are most of the weights: int8 halves what a checkpoint holds and what a decode step reads of them.

Which experts modules it takes: transformers' layout with its default gating (``act(gate) * up``, gate rows
first) or a SwiGLU limit (:data:`LIMITED_GATES`), no biases, no norm after the experts, an activation the kernels
have (:data:`ACTIVATIONS`). Anything else keeps its experts as they are (:func:`unsupported_reason` says why).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from laquant.kernels.common.dispatch import use_triton
from laquant.kernels.common.numerics import dequantize, quantize_int8
from laquant.kernels.moe.reference import ACTIVATIONS as KERNEL_ACTIVATIONS
from laquant.kernels.moe.reference import int8_experts
from laquant.quant.modules import Float32Buffers

# transformers' activation modules -> the kernels' names (laquant.kernels.moe.reference.ACTIVATIONS)
ACTIVATIONS = {"SiLUActivation": "silu", "SiLU": "silu", "ReLUSquaredActivation": "relu2"}
# experts classes whose gating is ``min(act(gate), limit) * clamp(up, -limit, limit)`` with their ``limit`` (None:
# the default gating)
LIMITED_GATES = ("BailingHybridExperts",)


def _gated(experts: nn.Module) -> bool:
    """Whether transformers' experts gate their input projection (``gate_up_proj``) or not (``up_proj``)."""
    return getattr(experts, "has_gate", hasattr(experts, "gate_up_proj"))


def _layout(experts: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input projection [E, 2I or I, H], down projection [E, H, I])`` of transformers' experts."""
    return getattr(experts, "gate_up_proj" if _gated(experts) else "up_proj"), experts.down_proj


def unsupported_reason(experts: nn.Module) -> str | None:
    """Why ``experts`` (a transformers experts module) cannot become a :class:`QuantExperts`; None if it can."""
    from transformers.integrations import moe

    gated = _gated(experts)
    weights = ("gate_up_proj" if gated else "up_proj", "down_proj")
    if not all(isinstance(getattr(experts, n, None), torch.Tensor) and getattr(experts, n).dim() == 3
               for n in weights):
        return f"no 3-D {' / '.join(weights)} weights"
    for flag, why in (("has_bias", "biases"), ("is_transposed", "transposed weights"),
                      ("has_post_expert_norm", "a norm after the experts")):
        if getattr(experts, flag, False):
            return why
    if gated and not getattr(experts, "is_concatenated", True):
        return "interleaved gate / up rows"
    apply_gate = getattr(type(experts), "_apply_gate", None)
    default = apply_gate is None or apply_gate is getattr(moe, "_default_apply_gate", apply_gate)
    if gated and not default and type(experts).__name__ not in LIMITED_GATES:
        return f"its own gating ({type(experts).__name__}._apply_gate)"
    act = type(getattr(experts, "act_fn", None)).__name__
    if act not in ACTIVATIONS:
        return f"activation {act} (the kernels have {', '.join(KERNEL_ACTIVATIONS)})"
    E, n_in, H = getattr(experts, weights[0]).shape
    if experts.down_proj.shape != (E, H, n_in // 2 if gated else n_in):
        return f"down_proj {tuple(experts.down_proj.shape)} does not fit {weights[0]} {(E, n_in, H)}"
    return None


def experts_form(experts: nn.Module) -> tuple[str, bool, float | None]:
    """``(activation, gated, limit)`` of a supported transformers experts module (:func:`unsupported_reason` None)."""
    limit = getattr(experts, "limit", None) if type(experts).__name__ in LIMITED_GATES else None
    return ACTIVATIONS[type(experts.act_fn).__name__], _gated(experts), None if limit is None else float(limit)


class QuantExperts(Float32Buffers, nn.Module):
    """A MoE layer's routed experts with int8 weights: ``in_qweight [E, 2I or I, H]`` (the gate's rows then the up
    projection's, or the up projection alone) and ``out_qweight [E, H, I]``, each with a float32 scale per expert
    and output channel (``in_scale [E, 2I or I]``, ``out_scale [E, H]``). Called as transformers' experts are."""

    FLOAT32_BUFFERS = ("in_scale", "out_scale")

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, gated: bool, activation: str,
                 limit: float | None = None):
        super().__init__()
        if activation not in KERNEL_ACTIVATIONS:
            raise ValueError(f"activation must be one of {KERNEL_ACTIVATIONS}; got {activation!r}")
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.gated, self.activation, self.limit = gated, activation, limit
        n_in = (2 if gated else 1) * intermediate_size
        self.register_buffer("in_qweight", torch.zeros(num_experts, n_in, hidden_size, dtype=torch.int8))
        self.register_buffer("in_scale", torch.ones(num_experts, n_in, dtype=torch.float32))
        self.register_buffer("out_qweight", torch.zeros(num_experts, hidden_size, intermediate_size, dtype=torch.int8))
        self.register_buffer("out_scale", torch.ones(num_experts, hidden_size, dtype=torch.float32))

    @classmethod
    def shaped_like(cls, experts: nn.Module) -> QuantExperts:
        """Empty (to load a checkpoint into), of ``experts``' shapes, built on its device (the meta device while
        transformers' ``from_pretrained`` builds the model: no host copy of a layer's experts on the way)."""
        reason = unsupported_reason(experts)
        if reason is not None:
            raise ValueError(f"{type(experts).__name__} cannot take int8 weights: {reason}")
        activation, gated, limit = experts_form(experts)
        E, H, I = experts.down_proj.shape
        with torch.device(experts.down_proj.device):
            return cls(E, H, I, gated, activation, limit)

    @classmethod
    def from_experts(cls, experts: nn.Module) -> QuantExperts:
        """``experts``' weights quantized per expert and output channel."""
        new = cls.shaped_like(experts)
        w_in, w_out = _layout(experts)
        for qweight, scale, w in ((new.in_qweight, new.in_scale, w_in), (new.out_qweight, new.out_scale, w_out)):
            for e in range(w.shape[0]):  # one expert at a time: no float32 copy of them all
                q, s = quantize_int8(w[e].detach(), dim=-1)
                qweight[e].copy_(q)
                scale[e].copy_(s.view(-1))
        return new

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The float32 weights the codes stand for: ``(input projection, down projection)`` in transformers'
        layout."""
        return (dequantize(self.in_qweight, self.in_scale.unsqueeze(-1)),
                dequantize(self.out_qweight, self.out_scale.unsqueeze(-1)))

    def _experts_args(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        """The arguments of :func:`~laquant.kernels.moe.reference.int8_experts` and its kernel twins."""
        return (hidden_states, top_k_index, top_k_weights, self.in_qweight, self.in_scale, self.out_qweight,
                self.out_scale, self.activation, self.gated, self.limit)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        args = self._experts_args(hidden_states, top_k_index, top_k_weights)
        if use_triton(hidden_states):
            from laquant.kernels.moe.grouped import int8_experts_triton

            return int8_experts_triton(*args)
        return int8_experts(*args)

    def pair_outputs(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor) -> torch.Tensor | None:
        """On the kernels' path, what :meth:`forward` sums per token before its last launch: each (token, expert)
        pair's output times its routing weight, ``[T * k, H]`` float32
        (:func:`~laquant.kernels.moe.grouped.int8_expert_pairs_triton`), for a kernel that adds the sum to more
        (Qwen3-Next's gated shared expert). None elsewhere, or without a pair; no forward hooks run."""
        if not use_triton(hidden_states) or top_k_index.numel() == 0:
            return None
        from laquant.kernels.moe.grouped import int8_expert_pairs_triton

        return int8_expert_pairs_triton(*self._experts_args(hidden_states, top_k_index, top_k_weights))

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden_size}, intermediate={self.intermediate_size}, "
                f"gated={self.gated}, activation={self.activation}, limit={self.limit}, weights=int8 per channel")
