"""transformers' MoE blocks with fewer launches on the GPU: the router's choice of experts in one, and Qwen3-Next's /
Qwen3.5-MoE's sigmoid-gated shared expert added to the routed experts in one.

A MoE router turns its logits into each token's top k experts and their weights with 6-15 PyTorch launches (softmax,
a top-k and its sort, a sum, a division, a cast; the grouped routers' group scores and masks and a second top-k):
on an H200 ~17 us of a one-token decode step's MoE layer, beside ~5 for the router's GEMM
(``eval/results/fused_moe_h200/``). :func:`install` gives each router of a class in :data:`ROUTERS` a forward that,
on the GPU, keeps transformers' logits (the same GEMM) and runs the rest as
:func:`laquant.kernels.moe.route.route_triton`, by the formula its table entry names
(:data:`laquant.kernels.moe.reference.ROUTINGS`); and each MoE block of a class in :data:`GATED_SHARED_BLOCKS` a
forward whose last five launches (the shared expert's one-column gate, its sigmoid, the product, the sum) are
:func:`laquant.kernels.moe.combine.gated_shared_sum_triton`, which also sums laquant's int8 experts' pairs (their last
launch, :meth:`laquant.quant.experts.QuantExperts.pair_outputs`). Elsewhere (CPU, autograd, a stream being captured
before the check below, ``LAQUANT_FUSED_MOE=0`` for comparisons) they run transformers' forward.

The classes change (their names kept), not the parameters or their names: checkpoints are untouched. The kernels
compute transformers' formulas in float32 with CUDA's ``exp`` and IEEE divisions, rounding as PyTorch's operations
do; the order of a few sums differs (the k routing weights', the shared gate's dot), by an ulp. Because a
transformers release could change a formula under the same class name, each class's first use in a process also
runs transformers' forward on the same tokens and compares: for a router the same experts for every token (a tie
at the k-th place may go either way: other experts with the same weights, for up to 1% of the tokens, at least one)
and weights within a few ulps of float32
(two of a 16-bit dtype); for a block its output within an ulp of its dtype (:func:`outputs_agree`). A class
that differs is warned about and keeps transformers' forward from then on. A router's outputs come in the order its
forward returns them, read off that first run (transformers 5.17's Granite 4 router returned the indices first).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from laquant.kernels.common.dispatch import use_triton
from laquant.kernels.common.env import getenv
from laquant.models.first_use import checked_forward, outputs_agree
from laquant.models.quantizing_rowwise import mix_into, original_class


class RouterForm(NamedTuple):
    routing: str  # laquant.kernels.moe.reference.ROUTINGS
    logits: str  # "linear": F.linear in the input's dtype; "linear_float": then float32; "float_linear": in float32
    weights_dtype: str  # the weights' dtype: "logits" (the logits'), "input" (the hidden states'), "float32"
    renormalize: bool | str = True  # or the router's attribute that says


_GROUPED = RouterForm("grouped_sigmoid", "float_linear", "float32", "norm_topk_prob")
ROUTERS = {
    "Qwen3NextTopKRouter": RouterForm("softmax", "linear", "logits", "norm_topk_prob"),
    "Qwen3_5MoeTopKRouter": RouterForm("softmax", "linear", "logits"),
    "MiniMaxTopKRouter": RouterForm("softmax", "linear", "float32"),
    "GraniteMoeHybridTopKRouter": RouterForm("topk_softmax", "linear_float", "input"),
    "KimiLinearTopkRouter": _GROUPED,
    "NemotronHTopkRouter": _GROUPED,
    "BailingHybridTopkRouter": _GROUPED,
}
# MoE blocks whose output is ``experts + sigmoid(shared_expert_gate(x)) * shared_expert(x)``
GATED_SHARED_BLOCKS = ("Qwen3NextSparseMoeBlock", "Qwen3_5MoeSparseMoeBlock")
_CHECKED: dict[type, bool] = {}  # class -> whether the fused forward reproduced transformers' forward
# router class -> where its forward puts (logits, weights, indices): transformers 5.25's routers return them in that
# order; 5.17's Granite 4 router returned (indices, weights, logits). Read off the forward's output at the check
_LAYOUTS: dict[type, tuple[int, int, int]] = {}


def route_arguments(router, form: RouterForm, logits: torch.Tensor, input_dtype: torch.dtype) -> dict:
    """The keyword arguments of :func:`laquant.kernels.moe.reference.route` (and its kernel twin) that route as
    ``router`` does by its table entry ``form``, for its ``logits`` of hidden states of ``input_dtype``."""
    out_dtype = {"logits": logits.dtype, "input": input_dtype, "float32": torch.float32}[form.weights_dtype]
    renormalize = getattr(router, form.renormalize) if isinstance(form.renormalize, str) else form.renormalize
    args = dict(top_k=router.top_k, routing=form.routing, renormalize=bool(renormalize), out_dtype=out_dtype)
    if form.routing == "grouped_sigmoid":
        args.update(bias=router.e_score_correction_bias, n_group=router.num_group, topk_group=router.topk_group,
                    scale=float(router.routed_scaling_factor))
    return args


def _fused(router, hidden_states: torch.Tensor, form: RouterForm):
    x = hidden_states.reshape(-1, router.weight.shape[1])
    if form.logits == "float_linear":
        logits = F.linear(x.float(), router.weight.float())
    else:
        logits = F.linear(x, router.weight)
        if form.logits == "linear_float":
            logits = logits.float()
    from laquant.kernels.moe.route import route_triton

    weights, indices = route_triton(logits, **route_arguments(router, form, logits, hidden_states.dtype))
    return logits, weights, indices


def output_layout(outputs, num_experts: int, top_k: int) -> tuple[int, int, int] | None:
    """Where a router's output tuple holds ``(logits, weights, indices)``: the one integer tensor is the indices, the
    float one ``num_experts`` wide the logits, the other the weights (the first float tensor the logits where they are
    as wide); None where the output is not such a triple."""
    if not (isinstance(outputs, tuple) and len(outputs) == 3 and all(isinstance(t, torch.Tensor) for t in outputs)):
        return None
    ints = [n for n, t in enumerate(outputs) if not t.is_floating_point()]
    floats = [n for n, t in enumerate(outputs) if t.is_floating_point()]
    if len(ints) != 1 or len(floats) != 2:
        return None
    logits = next((n for n in floats if outputs[n].shape[-1] == num_experts), None)
    if logits is None:
        return None
    weights = floats[1] if logits == floats[0] else floats[0]
    return (logits, weights, ints[0]) if outputs[weights].shape[-1] == top_k else None


def arranged(routing: tuple, layout: tuple[int, int, int]) -> tuple:
    """``(logits, weights, indices)`` placed where ``layout`` says."""
    out = [None, None, None]
    for value, where in zip(routing, layout):
        out[where] = value
    return tuple(out)


def routing_agrees(ours, theirs) -> str | None:
    """Why the routing ``ours`` (``(logits, weights, indices)``) is not transformers' ``theirs`` (the same order);
    None if it is."""
    (_, w, i), (_, w_ref, i_ref) = ours, theirs
    if w.dtype != w_ref.dtype or i.shape != i_ref.shape:
        return f"weights {w.dtype} {tuple(i.shape)} against {w_ref.dtype} {tuple(i_ref.shape)}"
    i_sorted, order = i.sort(dim=-1)
    i_ref_sorted, order_ref = i_ref.sort(dim=-1)
    same = (i_sorted == i_ref_sorted).all(dim=-1)
    tol = (16 if w.dtype == torch.float32 else 2) * torch.finfo(w.dtype).eps

    def off(a, b):
        return (a - b).abs() > tol * b.abs().clamp_min(1e-30)

    # a token whose experts differ must be a tie at the k-th place: the same weights, sorted, on other experts
    swapped = ~same & ~off(w.float().sort(-1)[0], w_ref.float().sort(-1)[0]).any(dim=-1)
    if bool((~same & ~swapped).any()) or int(swapped.sum()) > max(1, same.numel() // 100):
        return f"other experts for {int((~same).sum())} of {same.numel()} tokens"
    a = w.gather(-1, order)[same].float()
    b = w_ref.gather(-1, order_ref)[same].float()
    if not torch.isfinite(a).all() or off(a, b).any():
        return f"weights off by up to {((a - b).abs() / b.abs().clamp_min(1e-30)).max().item():.2e} (relative)"
    return None


def _on_kernels(module, x: torch.Tensor) -> bool:
    return (use_triton(x) and getenv("LAQUANT_FUSED_MOE", "1") != "0"
            and not (torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())))


class _FusedRouting:
    """Mixed into a router's class by :func:`install` (the original class next in the MRO)."""

    def forward(self, hidden_states):
        if not _on_kernels(self, hidden_states):
            return super().forward(hidden_states)
        cls = original_class(self)
        form = ROUTERS[cls.__name__]

        def original():
            out = super(_FusedRouting, self).forward(hidden_states)
            if cls not in _CHECKED:  # the check's run: learn where this transformers puts each output
                _LAYOUTS[cls] = output_layout(out, self.weight.shape[0], self.top_k)
            return out

        def agree(ours, theirs):
            layout = _LAYOUTS.get(cls)
            if layout is None:
                return "its output is not (logits, weights, indices) in some order"
            return routing_agrees(*(tuple(t[n] for n in layout) for t in (ours, theirs)))

        return checked_forward(self, hidden_states, lambda: arranged(_fused(self, hidden_states, form),
                                                                     _LAYOUTS.get(cls, (0, 1, 2))), original, agree,
                               _CHECKED)


def _gated_shared_block(block, hidden_states: torch.Tensor) -> torch.Tensor:
    from laquant.kernels.moe.combine import gated_shared_sum_triton

    x = hidden_states.view(-1, hidden_states.shape[-1])
    shared = block.shared_expert(x)
    _, routing_weights, selected_experts = block.gate(x)
    pairs_of = getattr(block.experts, "pair_outputs", None)  # laquant's int8 experts: their sum is summed here
    pairs = pairs_of(x, selected_experts, routing_weights) if pairs_of is not None else None
    if pairs is not None:
        out = gated_shared_sum_triton(x, block.shared_expert_gate.weight, shared, pairs, selected_experts.shape[1])
    else:
        routed = block.experts(x, selected_experts, routing_weights)
        out = gated_shared_sum_triton(x, block.shared_expert_gate.weight, shared, routed)
    return out.view(hidden_states.shape)


def _gated_shared_fits(block) -> bool:
    """The block has the parts its fused forward calls, and no hooks it would skip (the shared expert's gate is
    not called as a module) or run twice (the first-use check runs both forwards: a calibration observer would
    count those tokens twice)."""
    gate = getattr(block, "shared_expert_gate", None)
    return (isinstance(gate, torch.nn.Linear) and gate.bias is None and gate.weight.shape[0] == 1
            and all(getattr(block, n, None) is not None for n in ("shared_expert", "gate", "experts"))
            and not any(m._forward_hooks or m._forward_pre_hooks for m in block.modules()))


class _FusedGatedShared:
    """Mixed into a MoE block's class by :func:`install` (the original class next in the MRO)."""

    def forward(self, hidden_states):
        if (hidden_states.dim() != 3 or not _on_kernels(self, hidden_states) or not _gated_shared_fits(self)
                or hidden_states.dtype != self.shared_expert_gate.weight.dtype):
            return super().forward(hidden_states)
        return checked_forward(self, hidden_states, lambda: _gated_shared_block(self, hidden_states),
                               lambda: super(_FusedGatedShared, self).forward(hidden_states), outputs_agree, _CHECKED)


def install(model) -> int:
    """Give every router of ``model`` whose class is in :data:`ROUTERS` the one-launch routing, and every MoE block
    of a class in :data:`GATED_SHARED_BLOCKS` the one-launch shared-expert sum; returns how many. Idempotent."""
    modules = list(model.modules())
    return mix_into(modules, _FusedRouting, ROUTERS) + mix_into(modules, _FusedGatedShared, GATED_SHARED_BLOCKS)
