"""Projections that read the same input, run as one GEMM.

A linear-attention layer's q, k, v and output-gate projections all read the normed hidden state,
and so do an MLP's gate and up projections. Quantized with one set of outlier columns (they
are: the calibrated statistics are those of the one input they share), they can share one
activation quantization and one int8 GEMM over their concatenated weights, which is what
:func:`project` runs on the Triton path. The members stay separate modules, and checkpoints keep
one entry per module: the fused weight is built on first use, and the members' int8 weights and
outlier columns become row slices of it, so the weights are held once. It is rebuilt when a
member's buffers change (a reload).

Anything else (CPU, bf16 ``nn.Linear`` members, members with different outlier columns or
settings, forward hooks on a member) runs the members one by one, as before.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from laquant.kernels.common.dispatch import use_triton
from laquant.quant.modules import GPU_MODES, QuantLinear

_BUFFERS = ("qweight", "weight_scale", "keep_idx", "outlier_idx", "outlier_weight", "bias")


def _key(members) -> tuple:
    return tuple((b.data_ptr(), b._version) if b is not None else None
                 for m in members for b in (getattr(m, name) for name in _BUFFERS))


def _fusable(members, x: torch.Tensor) -> bool:
    first = members[0]
    return (len(members) > 1 and use_triton(x)
            and all(isinstance(m, QuantLinear) and not (m._forward_hooks or m._forward_pre_hooks) for m in members)
            and first.act_granularity in GPU_MODES and first.qweight.device == x.device
            and all(m.act_granularity == first.act_granularity and m.in_features == first.in_features
                    and m.n_main == first.n_main and m.n_outliers == first.n_outliers
                    and m.outlier_weight.dtype == first.outlier_weight.dtype for m in members))


def _same_columns(members) -> bool:
    first = members[0]
    return all(torch.equal(m.keep_idx, first.keep_idx) and torch.equal(m.outlier_idx, first.outlier_idx)
               for m in members[1:])


def _fuse(members):
    """The group's packed weight; the members' int8 weights and outlier columns become its row slices."""
    from laquant.kernels.gemm.int8 import PackedOutlierWeight

    first = members[0]
    qweight = torch.cat([m.qweight for m in members])
    outlier_weight = torch.cat([m.outlier_weight for m in members])
    scale = torch.cat([m.weight_scale.reshape(-1).float().expand(m.out_features) for m in members])
    bias = None
    if any(m.bias is not None for m in members):
        bias = torch.cat([m.bias if m.bias is not None else m.outlier_weight.new_zeros(m.out_features)
                          for m in members])
    start = 0
    for m in members:
        end = start + m.out_features
        m.qweight, m.outlier_weight = qweight[start:end], outlier_weight[start:end]
        m.__dict__.pop("_packed", None)  # its per-module pack held the old storage
        m.__dict__.pop("_packed_key", None)
        start = end
    return PackedOutlierWeight.pack(qweight, scale, first.keep_idx, first.outlier_idx, outlier_weight, bias,
                                    first.in_features)


def project(owner: nn.Module, names: tuple[str, ...], x: torch.Tensor) -> list[torch.Tensor]:
    """``[getattr(owner, n)(x) for n in names]``, as one GEMM where the members allow it (the
    outputs are then column slices of one tensor)."""
    members = [getattr(owner, n) for n in names]
    if not _fusable(members, x):
        return [m(x) for m in members]
    cache = owner.__dict__.setdefault("_fused_projections", {})
    key, packed = cache.get(names, (None, None))
    if key != _key(members):
        packed = _fuse(members) if _same_columns(members) else None
        cache[names] = (_key(members), packed)
    if packed is None:
        return [m(x) for m in members]
    from laquant.kernels.gemm.int8 import linear_triton

    y = linear_triton(x, packed, GPU_MODES[members[0].act_granularity])
    return list(y.split([m.out_features for m in members], dim=-1))
