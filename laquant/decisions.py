"""Per-module quantization decisions: what ``plan`` decides and a checkpoint records.

Each kind is a dataclass with ``to_dict`` / ``from_dict``; ``to_dict`` is exactly the JSON that
``config.json``'s ``quantization_config.decisions`` holds (so checkpoints written before these
types existed load unchanged). Each also reads as a mapping of that JSON (``d["format"]``,
``d.get("role")``), as ``Calibrated.decisions`` did when it was a plain dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


class _ReadsAsJSON(Mapping):
    def __getitem__(self, key):
        return self.to_dict()[key]

    def __iter__(self):
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


@dataclass(eq=True)
class ProjectionDecision(_ReadsAsJSON):
    """W8A8 int8 with the listed input channels kept in high precision (LLM.int8-style split).
    ``role``: ``softmax_attention`` for the q/k/v/o of attention layers, else None."""

    outliers: list[int]
    weight_granularity: str = "per_channel"
    act_granularity: str = "per_token"
    role: str | None = None
    format: str = "int8"

    def to_dict(self) -> dict:
        d = {"format": self.format, "outliers": list(self.outliers), "weight_granularity": self.weight_granularity,
             "act_granularity": self.act_granularity}
        return d if self.role is None else {**d, "role": self.role}

    @classmethod
    def from_dict(cls, d: dict) -> ProjectionDecision:
        return cls(list(d["outliers"]), d["weight_granularity"], d["act_granularity"], d.get("role"), d["format"])


@dataclass(eq=True)
class GateDecision(_ReadsAsJSON):
    """int8 gate weights; logits clamped to the calibrated range and quantized with static scales.
    ``channel_start``: the gate is ``n_channels`` outputs from there of a fused projection."""

    n_channels: int
    channel_start: int | None = None
    weight_granularity: str = "per_channel"
    scaling: str = "per_channel"
    clamp: bool = True
    format: str = "int8"

    def to_dict(self) -> dict:
        return {"format": self.format, "weight_granularity": self.weight_granularity, "scaling": self.scaling,
                "clamp": self.clamp, "n_channels": self.n_channels, "channel_start": self.channel_start}

    @classmethod
    def from_dict(cls, d: dict) -> GateDecision:
        return cls(d["n_channels"], d.get("channel_start"), d["weight_granularity"], d["scaling"], d["clamp"],
                   d["format"])


@dataclass(eq=True)
class StateDecision(_ReadsAsJSON):
    """The recurrent state's storage format, renormalisation interval (0: calibrated static scales)
    and whether a prefill rounds it to that format after every 64-token chunk (``prefill_roundtrip``)
    or only stores its final state in it. Checkpoints written before the field existed rounded at
    every chunk, and reload so. ``rounding``: nearest or stochastic stores (checkpoints written
    before the field existed rounded to nearest, and reload so)."""

    format: str
    renorm_interval: int = 1
    prefill_roundtrip: bool = False
    rounding: str = "nearest"

    def to_dict(self) -> dict:
        return {"format": self.format, "renorm_interval": self.renorm_interval,
                "prefill_roundtrip": self.prefill_roundtrip, "rounding": self.rounding}

    @classmethod
    def from_dict(cls, d: dict) -> StateDecision:
        return cls(d["format"], d["renorm_interval"], d.get("prefill_roundtrip", True), d.get("rounding", "nearest"))


@dataclass(eq=True)
class ExpertsDecision(_ReadsAsJSON):
    """A MoE layer's routed experts with int8 weights, one scale per expert and output channel (weight-only);
    ``activation``, ``gated`` and the SwiGLU ``limit`` are the experts' own, recorded so that a reload into experts of
    another form fails instead of computing something else."""

    activation: str
    gated: bool = True
    limit: float | None = None
    weight_granularity: str = "per_channel"
    format: str = "int8"

    def to_dict(self) -> dict:
        return {"format": self.format, "weight_granularity": self.weight_granularity, "activation": self.activation,
                "gated": self.gated, "limit": self.limit}

    @classmethod
    def from_dict(cls, d: dict) -> ExpertsDecision:
        return cls(d["activation"], d["gated"], d["limit"], d["weight_granularity"], d["format"])


SECTIONS = {"projections": ProjectionDecision, "gates": GateDecision, "state": StateDecision,
            "experts": ExpertsDecision}


@dataclass(eq=True)
class Decisions(_ReadsAsJSON):
    """Every module's decision, by role section, in the order they are applied."""

    projections: dict[str, ProjectionDecision] = field(default_factory=dict)
    gates: dict[str, GateDecision] = field(default_factory=dict)
    state: dict[str, StateDecision] = field(default_factory=dict)
    experts: dict[str, ExpertsDecision] = field(default_factory=dict)

    def __getitem__(self, section: str) -> dict:
        if section not in SECTIONS:
            raise KeyError(section)
        return getattr(self, section)

    def __iter__(self):
        return iter([section for section in SECTIONS if section != "experts" or self.experts])

    def to_dict(self) -> dict:
        """Every section, but ``experts`` only where the model has quantized experts (the JSON of a checkpoint
        without them is as it was before the section existed)."""
        return {section: {name: d.to_dict() for name, d in getattr(self, section).items()} for section in self}

    @classmethod
    def from_dict(cls, d: dict) -> Decisions:
        return cls(**{section: {name: kind.from_dict(x) for name, x in d.get(section, {}).items()}
                      for section, kind in SECTIONS.items()})

    def every_module(self) -> list[tuple[str, object]]:
        """``(module name, decision)`` for every module: projections first, then gates, state and experts."""
        return [(name, d) for section in SECTIONS for name, d in getattr(self, section).items()]
