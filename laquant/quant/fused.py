"""Projections that read the same input, run as one GEMM.

A linear-attention layer's q, k, v and output-gate projections all read the normed hidden state,
and so do an MLP's gate and up projections. Quantized with one set of outlier columns (they
are: the calibrated statistics are those of the one input they share), they can share one
activation quantization and one int8 GEMM over their concatenated weights, which is what
:func:`project` runs on the Triton path. Where that GEMM is W8A8 (:func:`w8a8_inputs`), the kernel
that makes the input (an RMSNorm, the gated norm, SwiGLU) also writes its int8 codes, so no
quantization pass runs on its own. The members stay separate modules, and checkpoints keep
one entry per module: the fused weight is built on first use, and the members' int8 weights and
outlier columns become row slices of it, so the weights are held once. It is rebuilt when a
member's buffers change (a reload).

Anything else (CPU, bf16 ``nn.Linear`` members, members with different outlier columns or
settings, forward hooks on a member) runs the members one by one, as before.

A quantized low-rank gate (GLA's ``gk_proj``: two weight-only int8 linears, then the gate tail)
runs as one kernel on the GPU (:func:`low_rank_gate`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from laquant.kernels.common.dispatch import use_triton
from laquant.kernels.common.gpus import device_name
from laquant.kernels.gemm.int8 import choose_config, group_config, int8_gemm
from laquant.kernels.rowwise.fused import codes_fit
from laquant.quant.modules import GPU_MODES, QuantLinear, buffers_key


def _members(owner: nn.Module, names: tuple[str, ...]) -> list[nn.Module]:
    mods = owner._modules  # not nn.Module.__getattr__: this runs for every projection of every forward
    return [mods[n] if n in mods else getattr(owner, n) for n in names]


def _key(members) -> tuple | None:
    """What a packed weight was built from: the members' activation modes and each buffer's storage
    and version (a reload or an in-place change moves one); None where a member is not a QuantLinear."""
    if not all(isinstance(m, QuantLinear) for m in members):
        return None
    return tuple([m.act_granularity for m in members] + [buffers_key(m) for m in members])


def _runs_packed(members, x: torch.Tensor) -> bool:
    """The members can run as one packed GEMM on x (GPU, quantized alike, no hooks to honour)."""
    first = members[0]
    return (use_triton(x)
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
                                    first.in_features, group=first.act_group)


def packed_group(owner: nn.Module, names: tuple[str, ...], x: torch.Tensor):
    """The one packed weight the members run as on the GPU for input ``x`` (fused when several), or
    None where they run module by module. The checks and the packing run again only when a member's
    buffers changed (:func:`_key`) or x is on another device; hooks are checked at every call."""
    if not use_triton(x):
        return None
    members = _members(owner, names)
    if any(m._forward_hooks or m._forward_pre_hooks for m in members):
        return None
    key = _key(members)
    if key is None:
        return None
    cache = owner.__dict__.setdefault("_fused_projections", {})
    entry = cache.get(names)
    if entry is not None and entry[0] == key and entry[1] == x.device:
        return entry[2]
    if not _runs_packed(members, x):
        packed = None
    elif len(members) == 1:
        packed = members[0].packed()
    else:
        packed = _fuse(members) if _same_columns(members) else None
        key = _key(members)  # fusing made the members' weights row slices of the packed one
    cache[names] = (key, x.device, packed)
    return packed


def w8a8_inputs(owner: nn.Module, names: tuple[str, ...], x: torch.Tensor, groups: bool = False):
    """The packed weight of W8A8 members that run as one GEMM on the GPU (so the kernel that makes x
    writes its int8 codes too, see :func:`project`), else None. Per-group members (``act_granularity: per_group``)
    only where the caller's kernel writes per-group codes (``groups``: the RMSNorm of one row a token and SwiGLU);
    elsewhere their GEMM quantizes its input in a pass of its own. ``x`` may be any
    tensor of the input's leading shape and device: only its device is read. None too where the
    GEMM is wider than a producer can write codes for (``MAX_CODES_WIDTH``, 16,384 inputs; a 70B
    model's 28,672-wide ``down_proj`` is wider): the GEMM then quantizes its input in its own pass.

    With the codes made by the producer, the W8A8 GEMM alone beat the weight-only one at every M
    measured (1 to 256 tokens, eval/results/speed_h100_e2e_fused.md), so a model path with a producer
    always runs W8A8: its numerics do not depend on the batch's token count. (A module called on
    its own takes ``linear_triton``'s ``auto``, whose table counts the quantization pass.)"""
    packed = packed_group(owner, names, x)
    if packed is None or _members(owner, names[:1])[0].act_granularity not in (
            ("per_token", "per_group") if groups else ("per_token",)):
        return None
    return packed if codes_fit(packed) else None  # wider: the GEMM quantizes its input itself


def project(owner: nn.Module, names: tuple[str, ...], x: torch.Tensor, codes=None) -> list[torch.Tensor]:
    """``[getattr(owner, n)(x) for n in names]``, as one GEMM where the members allow it (the
    outputs are then column slices of one tensor). ``codes``: x's W8A8 codes ``(xq, xs, xo)``
    for the packed weight :func:`w8a8_inputs` returned, written by the kernel that made x (which hands that
    weight over with them, ``codes.packed``: it is not looked up again)."""
    packed = getattr(codes, "packed", None)
    if packed is None:
        packed = packed_group(owner, names, x)
    members = _members(owner, names)
    if packed is None:
        if codes is not None:
            raise ValueError("activation codes were given for projections that do not run as one packed GEMM")
        return [m(x) for m in members]
    if codes is None:
        handoff = _handoff(x)
        codes = handoff.codes if handoff is not None and handoff.packed is packed else None
    if codes is None:
        from laquant.kernels.gemm.int8 import linear_triton

        y = linear_triton(x, packed, GPU_MODES[members[0].act_granularity])
    else:
        y = _gemm_on_codes(x, codes, packed)
    return list(y.split([m.out_features for m in members], dim=-1)) if len(members) > 1 else [y]


def joined_columns(parts) -> torch.Tensor:
    """``torch.cat(parts, -1)``, as a view where ``parts`` are consecutive column slices of one tensor (the outputs
    of one packed GEMM, :func:`project`, handed over or not): a mixer's q, k and v then reach its short conv
    without a copy."""
    first = parts[0]
    size, rows, strides = first.element_size(), first.shape[:-1], first.stride()
    end = first.data_ptr()
    for p in parts:
        if (p.data_ptr() != end or p.shape[:-1] != rows or p.stride() != strides or p.dtype != first.dtype
                or p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return torch.cat(parts, -1)
        end += p.shape[-1] * size
    width = sum(p.shape[-1] for p in parts)
    if first.dim() < 2 or strides[-1] != 1 or width > strides[-2]:
        return torch.cat(parts, -1)
    return first.as_strided((*rows, width), strides)


def _gemm_on_codes(x: torch.Tensor, codes: tuple, packed) -> torch.Tensor:
    """The W8A8 GEMM of ``packed`` on x's codes ``(xq, xs, xo)``: ``[*x.shape[:-1], N]``."""
    M, N, K = codes[0].shape[0], packed.qweight.shape[0], packed.in_features
    y = torch.empty(*x.shape[:-1], N, dtype=x.dtype, device=x.device)
    device = device_name(x.device)
    cfg = group_config(M, N, K, device) if packed.group else choose_config("w8a8", M, N, K, device)
    int8_gemm(*codes, packed, y.view(M, N), cfg)
    return y


def glu_w8a8(owner: nn.Module, down: str, gate: torch.Tensor, up: torch.Tensor,
             activation: str = "silu") -> torch.Tensor | None:
    """``owner.<down>(act(gate) * up)`` (SiLU: SwiGLU; sigmoid: a gated attention's output) with the
    kernel writing the codes of ``down``'s W8A8 GEMM (GPU), or None where ``down`` is not W8A8 on
    the GPU."""
    packed = w8a8_inputs(owner, (down,), gate, groups=True)
    if packed is None:
        return None
    from laquant.kernels.rowwise.fused import glu_triton

    h, codes = glu_triton(gate, up, packed, activation)
    return project(owner, (down,), h, codes)[0]


def glu_project(owner: nn.Module, down: str, gate: torch.Tensor, up: torch.Tensor,
                activation: str = "silu") -> torch.Tensor:
    """``owner.<down>(act(gate) * up)``: :func:`glu_w8a8` where ``down`` is W8A8 on the GPU, else the
    gated product (the kernel on the GPU, the reference elsewhere) and then the module."""
    out = glu_w8a8(owner, down, gate, up, activation)
    if out is not None:
        return out
    if use_triton(gate):
        from laquant.kernels.rowwise.fused import glu_triton

        h = glu_triton(gate, up, activation=activation)
    else:
        from laquant.kernels.rowwise.reference import glu

        h = glu(gate, up, activation)
    return getattr(owner, down)(h)


class CodesHandoff:
    """A tensor's W8A8 codes, written by the kernel that made it, handed to the projections that read
    it when their caller is not laquant's code (transformers' attention and MLP call ``q_proj(x)``,
    ``k_proj(x)``, ... one by one): :func:`hand_over` attaches it to the tensor, and
    :meth:`QuantLinear.forward <laquant.quant.modules.QuantLinear.forward>` takes its output from it
    (:func:`take_output`). The first member to run computes the whole group's GEMM in one launch;
    each member then takes its columns, once. A tensor changed in place since (its version moved),
    a module not in the group or a second call of a member computes as usual. ``codes`` None: the outputs
    were computed ahead from x itself (:func:`run_group_ahead`)."""

    __slots__ = ("version", "codes", "packed", "members", "outputs")

    def __init__(self, version: int, codes: tuple, packed, members: tuple):
        self.version, self.codes, self.packed, self.members, self.outputs = version, codes, packed, members, None


def hand_over(x: torch.Tensor, codes: tuple, owner: nn.Module, names: tuple[str, ...], packed) -> torch.Tensor:
    """Attach x's ``codes`` for the group ``owner.names`` (packed as ``packed``, from
    :func:`w8a8_inputs`) to x; returns x."""
    x._laquant_codes = CodesHandoff(x._version, codes, packed, tuple(_members(owner, names)))
    return x


def _handoff(x: torch.Tensor) -> CodesHandoff | None:
    """The codes handed over with x, or with the tensor x views when x holds the same rows in the same
    order (transformers' MoE blocks flatten the tokens, ``view(-1, hidden)``, before the shared
    expert); none once x changed in place since."""
    h = getattr(x, "_laquant_codes", None)
    if h is None and x._base is not None:
        base = x._base
        h = getattr(base, "_laquant_codes", None)
        if h is not None and not (x.data_ptr() == base.data_ptr() and x.numel() == base.numel()
                                  and x.shape[-1] == base.shape[-1] and x.is_contiguous() and base.is_contiguous()):
            h = None
    return h if h is not None and x._version == h.version else None


def run_group_ahead(owner: nn.Module, names: tuple[str, ...], x: torch.Tensor) -> None:
    """Run the group ``owner.names``' one GEMM on x now, quantizing x once, and hand its outputs over with x
    (:class:`CodesHandoff`): for projections that read the same tensor but get no codes from the kernel that made it
    (transformers multiplied it by a scalar first), called before transformers' code calls them one by one. Per-token
    members run W8A8 at every token count, as the groups whose codes a producer writes do (:func:`w8a8_inputs`).
    Nothing where the members do not run as one packed GEMM (CPU, different columns, hooks) or x already carries
    codes."""
    if len(names) < 2 or _handoff(x) is not None:
        return
    packed = packed_group(owner, names, x)
    if packed is None:
        return
    from laquant.kernels.gemm.int8 import linear_triton

    members = tuple(_members(owner, names))
    handoff = CodesHandoff(x._version, None, packed, members)
    mode = "w8a8" if members[0].act_granularity == "per_token" else GPU_MODES[members[0].act_granularity]
    handoff.outputs = list(linear_triton(x, packed, mode).split([m.out_features for m in members], dim=-1))
    x._laquant_codes = handoff


def take_output(module: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """``module(x)`` from the codes handed over with x (see :class:`CodesHandoff`), or None."""
    h = _handoff(x)
    i = None if h is None else next((j for j, m in enumerate(h.members) if m is module), None)
    if i is None:
        return None
    if h.outputs is None:
        h.outputs = list(_gemm_on_codes(x, h.codes, h.packed).split([m.out_features for m in h.members], dim=-1))
    out, h.outputs[i] = h.outputs[i], None
    return out


def low_rank_gate(gate: nn.Module, x: torch.Tensor):
    """``(first, second)``: the packed weights of a quantized low-rank gate that runs as one kernel
    on x (:func:`laquant.kernels.gla.gate.low_rank_gate_log_decay_triton`), else None: on the GPU,
    a QuantGate of two weight-only int8 linears without outlier columns (the first without bias,
    rank <= 64), and no hooks to honour."""
    linears = list(gate) if isinstance(gate, nn.Sequential) else []
    if (len(linears) != 2 or not use_triton(x) or gate._forward_hooks or gate._forward_pre_hooks
            or any(m._forward_hooks or m._forward_pre_hooks for m in linears)):
        return None
    # the checks below and the packing run again only when a linear's buffers changed or x is on another device
    key = _key(linears)
    if key is None:
        return None
    key = (key, getattr(gate, "channel_start", 0), x.device)
    cached = gate.__dict__.get("_low_rank_gate")
    if cached is not None and cached[0] == key:
        return cached[1]
    pair = _low_rank_pair(gate, linears, x)
    gate.__dict__["_low_rank_gate"] = (key, pair)
    return pair


def _low_rank_pair(gate: nn.Module, linears: list, x: torch.Tensor):
    if (getattr(gate, "channel_start", 0) is not None
            or not _runs_packed(linears[:1], x) or not _runs_packed(linears[1:], x)):
        return None
    first, second = linears
    if (first.act_granularity != "none" or second.act_granularity != "none" or first.n_outliers
            or second.n_outliers or first.bias is not None or first.out_features > 64
            or second.in_features != first.out_features):
        return None
    return first.packed(), second.packed()
