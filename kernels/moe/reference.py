"""Reference for a MoE layer's routed experts with int8 weights (the spec for :mod:`.grouped`), and for its router's
choice of experts (the spec for :mod:`.route`) and the sigmoid-gated shared expert's sum (:mod:`.combine`), at the end.

transformers holds a layer's experts as 3-D weights: ``gate_up_proj [E, 2I, H]`` (the gate's rows, then the up
projection's) or ``up_proj [E, I, H]`` for experts without a gate, and ``down_proj [E, H, I]``. Here each is int8
codes with a float32 scale per expert and output channel (weight-only: the tokens are not quantized; at decode
sizes the experts are bound by their weights' bytes, which int8 halves).

For each token ``t`` and each of its ``k`` experts ``e`` (routing weight ``w``):

``h = (x[t] @ codes_in[e]^T) * scale_in[e]`` in float32;
``a = act(h[:I]) * h[I:]`` (gated) or ``act(h)``, in float32, rounded to x's dtype; with a SwiGLU ``limit``
(Ling / Ring's experts) ``min(act(h[:I]), limit) * clamp(h[I:], -limit, limit)``;
``y = (a @ codes_out[e]^T) * scale_out[e] * w`` in float32;
``out[t] = sum over the token's k experts of y``, in float32, rounded to x's dtype.

The products' sums are float32 (the GPU kernel sums its tiles in another order: equal to the rounding of float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# transformers' expert activations that the kernels implement, by laquant's name
ACTIVATIONS = ("silu", "relu2")


def activate(h: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "silu":
        return F.silu(h)
    if activation == "relu2":
        return F.relu(h).square()
    raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")


def check_experts(x, top_k_index, top_k_weights, in_codes, in_scale, out_codes, out_scale, activation: str,
                  gated: bool) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    if x.dim() != 2 or top_k_index.dim() != 2 or top_k_weights.shape != top_k_index.shape:
        raise ValueError(f"expected x [T, H], top_k_index and top_k_weights [T, k]; got {tuple(x.shape)}, "
                         f"{tuple(top_k_index.shape)}, {tuple(top_k_weights.shape)}")
    E, n_in, H = in_codes.shape
    I = n_in // 2 if gated else n_in
    if (x.shape[1] != H or top_k_index.shape[0] != x.shape[0] or out_codes.shape != (E, H, I)
            or (gated and n_in % 2) or in_scale.shape != (E, n_in) or out_scale.shape != (E, H)):
        raise ValueError(f"experts do not fit x {tuple(x.shape)}: in {tuple(in_codes.shape)} (gated={gated}), "
                         f"scale {tuple(in_scale.shape)}, out {tuple(out_codes.shape)}, scale {tuple(out_scale.shape)}")
    if in_codes.dtype != torch.int8 or out_codes.dtype != torch.int8:
        raise ValueError("expert weights must be int8 codes")


def gate(h: torch.Tensor, activation: str, gated: bool, limit: float | None = None) -> torch.Tensor:
    """The experts' activation of their input projection's output ``h [.., 2I or I]``."""
    if not gated:
        return activate(h, activation)
    g, u = h.chunk(2, dim=-1)
    g = activate(g, activation)
    if limit is not None:
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return g * u


def int8_experts(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, in_codes: torch.Tensor,
                 in_scale: torch.Tensor, out_codes: torch.Tensor, out_scale: torch.Tensor, activation: str,
                 gated: bool, limit: float | None = None) -> torch.Tensor:
    """``out [T, H]`` in x's dtype for ``x [T, H]`` routed to ``top_k_index [T, k]`` with ``top_k_weights [T, k]``;
    ``in_codes [E, 2I or I, H]`` / ``out_codes [E, H, I]`` int8 with float32 ``in_scale [E, 2I or I]`` /
    ``out_scale [E, H]``. Experts no token chose are not read."""
    check_experts(x, top_k_index, top_k_weights, in_codes, in_scale, out_codes, out_scale, activation, gated)
    T, k = top_k_index.shape
    pair_out = torch.zeros(T * k, x.shape[1], dtype=torch.float32, device=x.device)
    expert_of_pair = top_k_index.reshape(-1)
    weight_of_pair = top_k_weights.reshape(-1).float()
    for e in expert_of_pair.unique().tolist():
        pairs = (expert_of_pair == e).nonzero().flatten()
        h = (x[pairs // k].float() @ in_codes[e].float().T) * in_scale[e]
        a = gate(h, activation, gated, limit)
        y = (a.to(x.dtype).float() @ out_codes[e].float().T) * out_scale[e]
        pair_out[pairs] = y * weight_of_pair[pairs, None]
    return pair_out.view(T, k, x.shape[1]).sum(1).to(x.dtype)


# a router's formulas, as transformers' MoE routers compute them from their logits (laquant.models.fused_moe maps
# each router class to one):
#   "softmax": softmax over the experts in float32, the top k of it (Qwen3-Next, Qwen3.5-MoE, MiniMax);
#   "topk_softmax": the top k logits in float32, softmax over them (Granite 4);
#   "grouped_sigmoid": sigmoid of the logits, plus a bias for the choice only; each group of experts scored by its top
#   two, the best groups kept, the top k experts in them (DeepSeek-V3's: Kimi Linear, Nemotron-H, Ling / Ring)
ROUTINGS = ("softmax", "topk_softmax", "grouped_sigmoid")


def check_route(logits: torch.Tensor, top_k: int, routing: str, bias: torch.Tensor | None, n_group: int,
                topk_group: int) -> None:
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}; got {routing!r}")
    if logits.dim() != 2:
        raise ValueError(f"expected router logits [T, E]; got {tuple(logits.shape)}")
    E = logits.shape[1]
    if not 0 < top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}] for {E} experts; got {top_k}")
    if routing == "grouped_sigmoid":
        if bias is None or bias.shape != (E,):
            raise ValueError(f"grouped_sigmoid routing needs a bias of shape ({E},); got "
                             f"{None if bias is None else tuple(bias.shape)}")
        if n_group < 1 or E % n_group or E // n_group < 2 or not 0 < topk_group <= n_group:
            raise ValueError(f"{E} experts cannot form {n_group} groups of >= 2 with {topk_group} kept")
        if topk_group * (E // n_group) < top_k:
            raise ValueError(f"{topk_group} groups of {E // n_group} experts hold fewer than top_k = {top_k}")


def route(logits: torch.Tensor, top_k: int, routing: str, renormalize: bool = True,
          out_dtype: torch.dtype = torch.float32, bias: torch.Tensor | None = None, n_group: int = 1,
          topk_group: int = 1, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, k] in out_dtype, expert indices [T, k] int64)`` of a MoE router's ``logits [T, E]``, by the
    ``routing`` formula (:data:`ROUTINGS`), transformers' operations in transformers' order. ``renormalize``: the k
    weights divided by their sum ("softmax"; "grouped_sigmoid" adds 1e-20 to the sum); "grouped_sigmoid" then
    multiplies by ``scale``. The experts come in ``torch.topk``'s descending order (where transformers asks for them
    unsorted, the same set; the kernel breaks ties by the lower index)."""
    check_route(logits, top_k, routing, bias, n_group, topk_group)
    x = logits.float()
    if routing == "softmax":
        probs = torch.softmax(x, dim=-1)
        weights, indices = torch.topk(probs, top_k, dim=-1)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    elif routing == "topk_softmax":
        top, indices = torch.topk(x, top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
    else:
        scores = x.sigmoid()
        choice = scores + bias.float()
        T, E = x.shape
        groups = choice.view(T, n_group, E // n_group).topk(2, dim=-1)[0].sum(dim=-1)
        kept = torch.zeros_like(groups).scatter_(1, torch.topk(groups, topk_group, dim=-1)[1], 1).bool()
        choice = choice.masked_fill(~kept.repeat_interleave(E // n_group, dim=1), float("-inf"))
        indices = torch.topk(choice, top_k, dim=-1)[1]
        weights = scores.gather(1, indices)
        if renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * scale
    return weights.to(out_dtype), indices


def gated_shared_sum(x: torch.Tensor, gate_weight: torch.Tensor, shared: torch.Tensor,
                     routed: torch.Tensor) -> torch.Tensor:
    """Qwen3-Next's and Qwen3.5-MoE's MoE output: ``routed + sigmoid(x @ gate_weight^T) * shared`` for tokens ``x
    [T, H]``, the shared expert's gate ``gate_weight [1, H]``, its output ``shared [T, H]`` and the routed experts'
    ``routed [T, H]``, each operation rounded to x's dtype as transformers' operations are."""
    return routed + torch.sigmoid(F.linear(x, gate_weight)) * shared
