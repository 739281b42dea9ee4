"""A MoE layer's sigmoid-gated shared expert added to its routed experts' output, in one launch.

Spec: :func:`.reference.gated_shared_sum` (Qwen3-Next's and Qwen3.5-MoE's MoE block after its experts). transformers
runs it as five launches (the gate's one-column GEMM as a dot and its reduction, the sigmoid, the product, the sum),
~8 us of a one-token decode step's MoE layer on an H200. Where the routed experts are laquant's int8 ones, it also sums
their pairs (the experts' own last launch). Here one program takes one token: the gate's dot in float32
(in another order than cuBLAS's, so the rounded logit can differ by an ulp of its dtype), then every operation
rounded to the tokens' dtype as PyTorch's are (:func:`~laquant.kernels.common.triton_numerics.rounded`), the
sigmoid with CUDA's ``expf`` and an IEEE division as PyTorch's.
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel

try:
    import triton
    import triton.language as tl
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

if triton is not None:
    from ..common.triton_numerics import exp_as_torch, rounded
    from .grouped import summed_pairs

    @triton.jit
    def _gated_shared_sum_kernel(x_ptr, g_ptr, shared_ptr, routed_ptr, out_ptr, H, s_xt, s_st, s_rt,
                                 BLOCK_H: tl.constexpr, TOPK: tl.constexpr = 0):
        """``TOPK`` (> 0): ``routed_ptr`` holds the routed experts' pairs, ``[T * TOPK, H]`` float32, summed here as
        the experts' last launch sums them and rounded to the dtype as it stores them."""
        t = tl.program_id(0).to(tl.int64)
        dtype = out_ptr.dtype.element_ty
        dot = tl.zeros([BLOCK_H], dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            ok = h < H
            x = tl.load(x_ptr + t * s_xt + h, mask=ok, other=0.0).to(tl.float32)
            dot += x * tl.load(g_ptr + h, mask=ok, other=0.0).to(tl.float32)
        logit = rounded(tl.sum(dot, axis=0), dtype)
        gate = rounded(tl.math.div_rn(1.0, 1.0 + exp_as_torch(-logit)), dtype)
        for h0 in range(0, H, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            ok = h < H
            shared = tl.load(shared_ptr + t * s_st + h, mask=ok, other=0.0).to(tl.float32)
            if TOPK > 0:
                routed = rounded(summed_pairs(routed_ptr, t, h, ok, H, TOPK), dtype)
            else:
                routed = tl.load(routed_ptr + t * s_rt + h, mask=ok, other=0.0).to(tl.float32)
            out = rounded(routed + rounded(gate * shared, dtype), dtype)
            tl.store(out_ptr + t * H + h, out.to(dtype), mask=ok)


def gated_shared_sum_triton(x: torch.Tensor, gate_weight: torch.Tensor, shared: torch.Tensor,
                            routed: torch.Tensor, top_k: int = 0) -> torch.Tensor:
    """Twin of :func:`.reference.gated_shared_sum`, one launch. The inputs may have any row stride (columns
    contiguous); all in one dtype. ``top_k`` > 0: ``routed`` is the int8 experts' pairs before their sum
    (:func:`~laquant.kernels.moe.grouped.int8_expert_pairs_triton`: ``[T * top_k, H]`` float32, contiguous), summed
    and rounded here as :func:`~laquant.kernels.moe.grouped.int8_experts_triton` would have: the same output, bit
    for bit, without that launch."""
    T, H = x.shape
    want = (T * top_k, H) if top_k else (T, H)
    if gate_weight.shape != (1, H) or shared.shape != (T, H) or routed.shape != want:
        raise ValueError(f"expected gate_weight [1, {H}], shared [{T}, {H}] and routed {list(want)}; got "
                         f"{tuple(gate_weight.shape)}, {tuple(shared.shape)}, {tuple(routed.shape)}")
    routed_dtype = torch.float32 if top_k else x.dtype
    if len({x.dtype, gate_weight.dtype, shared.dtype}) != 1 or routed.dtype != routed_dtype:
        raise ValueError(f"x, gate_weight and shared must share a dtype and routed be {routed_dtype}; got {x.dtype}, "
                         f"{gate_weight.dtype}, {shared.dtype}, {routed.dtype}")
    if any(t.stride(-1) != 1 for t in (x, gate_weight, shared, routed)) or (top_k and not routed.is_contiguous()):
        raise ValueError("the kernel needs the inputs' columns contiguous (and the routed pairs contiguous)")
    out = torch.empty(T, H, dtype=x.dtype, device=x.device)
    if T:
        launch_kernel(_gated_shared_sum_kernel, (T,), x, gate_weight, shared, routed, out, H, x.stride(0),
                      shared.stride(0), routed.stride(0), BLOCK_H=1024, TOPK=top_k, num_warps=4)
    return out
