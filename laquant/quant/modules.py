"""Quantized modules that replace a model's ``nn.Linear`` layers.

All numerics go through :mod:`laquant.kernels.common.numerics` and :mod:`laquant.kernels`; the modules only
hold the quantized tensors (as buffers, so they save and load with the state dict) and wire them.
Each module can be built empty from its recorded decision (shapes only), which is how a
checkpoint is reloaded: build, then ``load_state_dict``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from laquant.kernels import int8_outlier_linear
from laquant.kernels.common.dispatch import use_triton
from laquant.kernels.common.numerics import ACT_GROUP, INT8_MAX, dequantize, fake_quantize_int8, quantize_int8

GRANULARITIES = ("per_channel", "per_tensor")
# none: weight-only; per_group: one activation scale per token and group of 128 columns (ACT_GROUP)
ACT_GRANULARITIES = ("per_token", "per_tensor", "per_group", "none")
# the GPU GEMM each activation granularity runs (laquant.kernels.gemm.int8.linear_triton): per-token
# W8A8, or weight-only where the committed sweep found it faster at that many tokens ("auto");
# weight-only always for "none"; per-group W8A8 always for "per_group" (its weight's layout says so).
# Per-tensor activations run the reference.
GPU_MODES = {"per_token": "auto", "per_group": "w8a8", "none": "w8a16"}
# the buffers a packed GPU weight is built from: their storages and versions say when to rebuild it
PACKED_FROM = ("qweight", "weight_scale", "keep_idx", "outlier_idx", "outlier_weight", "bias")


def buffers_key(module: nn.Module) -> tuple:
    """``(data_ptr, version)`` of each of ``module``'s :data:`PACKED_FROM` buffers (None where unset):
    a reload or an in-place change moves one. Read from ``_buffers`` directly, not through
    ``nn.Module.__getattr__``: this runs at every quantized linear's call."""
    return tuple([(b.data_ptr(), b._version) if b is not None else None for b in map(module._buffers.get, PACKED_FROM)])


class Float32Buffers:
    """Mixin for modules whose :attr:`FLOAT32_BUFFERS` stay float32 when the model is cast
    (``model.to(torch.bfloat16)``, ``.half()``): scales and calibrated bounds rounded to the model's dtype would change
    every value computed from them, silently (and the kernels read them as float32). Device moves apply as usual."""

    FLOAT32_BUFFERS: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        kept = {name: self._buffers[name] for name in self.FLOAT32_BUFFERS if self._buffers.get(name) is not None}
        out = super()._apply(fn, recurse)
        for name, old in kept.items():
            new = self._buffers[name]
            if new is not None and new.dtype != old.dtype:
                self._buffers[name] = old.to(new.device)
        return out


class QuantLinear(Float32Buffers, nn.Module):
    """W8A8 int8 linear with an LLM.int8-style outlier split.

    Input channels listed in ``outlier_idx`` skip quantization and go through a small matmul in
    the model's dtype; the rest are quantized (activations per token, dynamically; weights per
    output channel) and multiplied in int8 with exact int32 accumulation. The two are summed.

    With ``act_granularity="per_group"`` the activations get one scale per token and group of
    :data:`~laquant.kernels.common.numerics.ACT_GROUP` input columns, and the int8 weight keeps every input column in
    order (``n_main == in_features``), zero at the outlier columns, so that its column groups are the input's.
    """

    FLOAT32_BUFFERS = ("weight_scale",)

    def __init__(self, in_features: int, out_features: int, n_outliers: int, bias: bool,
                 weight_granularity: str = "per_channel", act_granularity: str = "per_token",
                 dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_granularity, self.act_granularity = weight_granularity, act_granularity
        if act_granularity not in ACT_GRANULARITIES:
            raise ValueError(f"act_granularity must be one of {ACT_GRANULARITIES}, got {act_granularity!r}")
        n_main = in_features if act_granularity == "per_group" else in_features - n_outliers
        self.n_main = n_main
        # rows padded with zero columns to a multiple of 16 bytes: the GEMM kernel's tiles need
        # aligned rows, and it reads this buffer itself (no second copy of the weight)
        self.register_buffer("qweight", torch.zeros(out_features, -(-n_main // 16) * 16, dtype=torch.int8))
        n_scales = out_features if weight_granularity == "per_channel" else 1
        self.register_buffer("weight_scale", torch.ones(n_scales, 1, dtype=torch.float32))
        self.register_buffer("keep_idx", torch.arange(n_main, dtype=torch.long))
        self.register_buffer("outlier_idx", torch.zeros(n_outliers, dtype=torch.long))
        self.register_buffer("outlier_weight", torch.zeros(out_features, n_outliers, dtype=dtype))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, outlier_idx: torch.Tensor, weight_granularity: str = "per_channel",
                    act_granularity: str = "per_token") -> QuantLinear:
        w = linear.weight.detach()
        outlier_idx = torch.as_tensor(outlier_idx, dtype=torch.long).sort().values
        mod = cls(linear.in_features, linear.out_features, len(outlier_idx), linear.bias is not None,
                  weight_granularity, act_granularity, dtype=w.dtype)
        keep = torch.ones(linear.in_features, dtype=torch.bool)
        if act_granularity == "per_group":  # every column in order, the outliers' zero (the same int8 values)
            keep_idx = keep.nonzero().flatten()
            kept = w.clone()
            kept[:, outlier_idx] = 0
        else:
            keep[outlier_idx] = False
            keep_idx = keep.nonzero().flatten()
            kept = w[:, keep_idx]
        qweight, scale = quantize_int8(kept, dim=-1 if weight_granularity == "per_channel" else None)
        mod.qweight[:, :mod.n_main].copy_(qweight)
        mod.weight_scale.copy_(scale.reshape(-1, 1))
        mod.keep_idx.copy_(keep_idx)
        mod.outlier_idx.copy_(outlier_idx)
        mod.outlier_weight.copy_(w[:, outlier_idx])
        if linear.bias is not None:
            mod.bias.copy_(linear.bias.detach())
        return mod.to(w.device)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in ("qweight", "outlier_weight"):  # row slices of a fused group's weight (laquant.quant.fused)
            buf = self._buffers[name]
            if buf._base is not None:
                destination[prefix + name] = buf.detach().clone()

    @property
    def n_outliers(self) -> int:
        return self.outlier_idx.numel()

    @property
    def act_group(self) -> int:
        """Input columns an activation scale covers along the row: :data:`ACT_GROUP` under ``per_group``, 0 (the
        whole row) otherwise."""
        return ACT_GROUP if self.act_granularity == "per_group" else 0

    def packed(self):
        """The weight as the Triton GEMM reads it, rebuilt when a buffer changed (e.g. a reload)."""
        from laquant.kernels.gemm.int8 import PackedOutlierWeight

        key = buffers_key(self)
        if self.__dict__.get("_packed_key") != key:
            self._packed = PackedOutlierWeight.pack(self.qweight, self.weight_scale, self.keep_idx, self.outlier_idx,
                                                    self.outlier_weight, self.bias, self.in_features,
                                                    group=self.act_group)
            self._packed_key = key
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_granularity in GPU_MODES and use_triton(x):
            from laquant.kernels.gemm.int8 import linear_triton
            from laquant.quant.fused import take_output

            out = take_output(self, x)  # x's codes came with it (a fused norm before transformers' code)
            if out is not None:
                return out

            return linear_triton(x, self.packed(), GPU_MODES[self.act_granularity])
        return int8_outlier_linear(
            x, self.qweight[:, :self.n_main], self.weight_scale,
            None if self.n_outliers == 0 or self.act_group else self.keep_idx,
            self.outlier_idx, self.outlier_weight, self.bias, self.act_granularity,
        )

    def dequantized_weight(self) -> torch.Tensor:
        w = torch.empty(self.out_features, self.in_features, dtype=torch.float32, device=self.qweight.device)
        w[:, self.keep_idx] = dequantize(self.qweight[:, :self.n_main], self.weight_scale)
        w[:, self.outlier_idx] = self.outlier_weight.float()
        return w

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, outliers={self.n_outliers}, "
                f"weight={self.weight_granularity}, act={self.act_granularity}")


class QuantGate(Float32Buffers, nn.Sequential):
    """A gate projection (GLA's low-rank ``gk_proj``, GDN's ``in_proj_ba``, Mamba2's ``dt`` channels
    of ``in_proj``) with calibrated per-channel handling.

    The projection's linears are :class:`QuantLinear` (or kept as they are); the gate logits are
    then clamped to the calibrated range ``[logit_min, logit_max]`` of each output channel and
    quantized to int8 with a static scale per channel (``scaling: per_channel``) or one for all
    channels (``per_tensor``, the naive form, where a few extreme channels cost the others their
    resolution). ``channel_start``: the gate is the ``n_channels`` outputs from there of a fused
    projection; the other outputs pass through untouched. Keeping the index-based names of
    ``nn.Sequential`` keeps parameter paths stable.
    """

    FLOAT32_BUFFERS = ("logit_min", "logit_max", "logit_scale")

    def __init__(self, *linears: nn.Module, n_channels: int, scaling: str = "per_channel", clamp: bool = True,
                 channel_start: int | None = None):
        super().__init__(*linears)
        self.scaling, self.clamp, self.channel_start = scaling, clamp, channel_start
        n = n_channels if scaling == "per_channel" else 1
        # float32 whatever the default dtype (transformers' from_pretrained(dtype=bf16) builds under bf16)
        self.register_buffer("logit_min", torch.full((n_channels,), -torch.inf, dtype=torch.float32))
        self.register_buffer("logit_max", torch.full((n_channels,), torch.inf, dtype=torch.float32))
        self.register_buffer("logit_scale", torch.ones(n, dtype=torch.float32))

    def calibrate(self, logit_min: torch.Tensor, logit_max: torch.Tensor) -> None:
        self.logit_min.copy_(logit_min)
        self.logit_max.copy_(logit_max)
        amax = torch.maximum(logit_min.abs(), logit_max.abs()).float()
        amax = amax if self.scaling == "per_channel" else amax.max().reshape(1)
        self.logit_scale.copy_(amax.clamp_min(1e-8) / INT8_MAX)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.channel_start is None:
            return self.treat(out)
        s, e = self.channel_start, self.channel_start + self.logit_min.numel()
        return torch.cat([out[..., :s], self.treat(out[..., s:e]), out[..., e:]], -1)

    def untreated(self, x: torch.Tensor) -> torch.Tensor:
        """The linears' whole output, the logits untreated: for a gate of a fused projection, whose
        caller passes the gate's channels alone through :meth:`treat` (forward assembles a treated copy
        of the whole output)."""
        return super().forward(x)

    def logit_treatment(self) -> dict:
        """The calibrated treatment of the logits, as :func:`~laquant.kernels.gla.gate.gate_log_decay` takes it."""
        bounds = self.clamp
        return {"logit_min": self.logit_min if bounds else None, "logit_max": self.logit_max if bounds else None,
                "logit_scale": self.logit_scale}

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The gate's linears alone (the logits before their treatment); a gate of a fused projection
        (``channel_start``) has no logits of its own to return."""
        if self.channel_start is not None:
            raise ValueError("a gate that is a slice of a fused projection has no projection of its own")
        return self.untreated(x)

    def treat(self, logits: torch.Tensor) -> torch.Tensor:
        """The gate's logits clamped to their calibrated range and rounded through int8 (what forward applies)."""
        t = self.logit_treatment()
        return fake_quantize_int8(logits, t["logit_scale"], t["logit_min"], t["logit_max"])

    def extra_repr(self) -> str:
        where = "" if self.channel_start is None else f", channels={self.channel_start}+{self.logit_min.numel()}"
        return f"scaling={self.scaling}, clamp={self.clamp}{where}"
