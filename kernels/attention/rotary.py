"""Triton kernel: the cos and sin of default rotary position embeddings, in one launch.

transformers' rotary embedding modules compute them every forward (every decode step) with ~8 PyTorch launches: the
positions cast to float32, their product with the inverse frequencies, the cat of the two halves, cos, sin, the
scaling of each and the casts. Spec: :func:`rotary_cos_sin`, transformers' default formula. The kernel computes it
in the same float32 operations (the product of a position and a frequency; ``tl.cos`` / ``tl.sin``, which lower to
libdevice's precise ``cosf`` / ``sinf``, as CUDA's ``cos`` / ``sin`` do; the scaling; one rounding to the output's
dtype); :mod:`laquant.models.fused_rotary` checks it against each module class's own forward at first use.
"""

from __future__ import annotations

import torch

from ..common.launch import launch_kernel
from ..common.sizes import next_power_of_2

try:
    import triton
    import triton.language as tl
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


def rotary_cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``[*position_ids.shape, 2 * len(inv_freq)]`` in ``dtype``: transformers' default rotary
    embedding of integer ``position_ids`` with the inverse frequencies ``inv_freq`` (taken to float32)."""
    freqs = position_ids[..., None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


if triton is not None:

    @triton.jit
    def _rotary_cos_sin_kernel(pos_ptr, inv_ptr, cos_ptr, sin_ptr, scaling, HALF, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, BLOCK)
        ok = i < 2 * HALF
        inv = tl.load(inv_ptr + tl.where(i < HALF, i, i - HALF), mask=ok, other=0.0).to(tl.float32)
        f = tl.load(pos_ptr + row).to(tl.float32) * inv
        out = row * 2 * HALF + i
        tl.store(cos_ptr + out, (tl.cos(f) * scaling).to(cos_ptr.dtype.element_ty), mask=ok)
        tl.store(sin_ptr + out, (tl.sin(f) * scaling).to(sin_ptr.dtype.element_ty), mask=ok)


def rotary_cos_sin_triton(position_ids: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of :func:`rotary_cos_sin`, one launch. ``inv_freq``: 1-D, of any float dtype (a model cast to bf16 casts
    its buffers too; transformers' forward then takes it to float32, as the kernel does)."""
    if position_ids.is_floating_point() or not inv_freq.is_floating_point() or inv_freq.dim() != 1:
        raise ValueError(f"expected integer position_ids and a 1-D float inv_freq; got {position_ids.dtype} and "
                         f"{inv_freq.dtype} {tuple(inv_freq.shape)}")
    half = inv_freq.shape[0]
    cos = torch.empty(*position_ids.shape, 2 * half, dtype=dtype, device=position_ids.device)
    sin = torch.empty_like(cos)
    if position_ids.numel():
        launch_kernel(_rotary_cos_sin_kernel, (position_ids.numel(),), position_ids.contiguous(),
                      inv_freq.contiguous(), cos, sin, float(scaling), half, BLOCK=next_power_of_2(2 * half),
                      num_warps=1)
    return cos, sin
