"""Calibration statistics: named float32 tensors ``"<module>/<stat>"`` plus metadata, in safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from laquant.errors import LaquantError


class Stats:
    """Per-module statistics. Projections: ``act_absmax``, ``act_p999`` (per input channel),
    ``act_over_levels`` (per input channel and each of ``meta["magnitude_levels"]``: the fraction of
    tokens above it; read through :meth:`over_threshold`), ``weight_min``/``weight_max`` (per output
    channel). Gates: ``logit_min``,
    ``logit_max``, ``logit_p001``, ``logit_p999``, ``log_decay_min``, ``log_decay_max`` (per
    channel). Mixers: ``state_absmax`` ``[H, K]``, ``state_trajectory`` ``[checkpoints, H, K]`` (the
    absmax at each checkpoint), ``state_growth`` ``[H, K]`` (nats per 1K tokens over the second
    half), ``checkpoints`` (token positions)."""

    def __init__(self, tensors: dict[str, torch.Tensor], meta: dict):
        self.tensors = tensors
        self.meta = meta

    def get(self, module: str, stat: str) -> torch.Tensor:
        key = f"{module}/{stat}"
        if key not in self.tensors:
            raise LaquantError(f"calibration statistics have no {key!r}: were they collected for this model?")
        return self.tensors[key]

    def over_threshold(self, module: str, threshold: float) -> torch.Tensor:
        """Per input channel of a projection, the fraction of calibration tokens with |x| > ``threshold``."""
        if f"{module}/act_over_levels" in self.tensors:
            levels = self.meta["magnitude_levels"]
            if threshold not in levels:
                raise LaquantError(f"the statistics count |x| above {levels[0]:g}, {levels[1]:g}, ... {levels[-1]:g} "
                                   f"(powers of two and 1.5 times them), not above {threshold:g}")
            return self.get(module, "act_over_levels")[:, levels.index(threshold)]
        if self.meta.get("threshold") == threshold:  # statistics of laquant 0.1 counted at one threshold
            return self.get(module, "act_over_threshold")
        raise LaquantError(f"these statistics count |x| above {self.meta.get('threshold')} only, not {threshold:g}; "
                           "collect them again")

    def modules(self, role: str) -> list[str]:
        return list(self.meta.get("roles", {}).get(role, []))

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in self.tensors.items()}, str(path),
                  metadata={"laquant_stats": json.dumps(self.meta)})

    @classmethod
    def load(cls, path: str | Path) -> Stats:
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise LaquantError(f"statistics file not found: {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = json.loads((f.metadata() or {})["laquant_stats"])
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as exc:
            raise LaquantError(f"{path} is not a laquant statistics file or is corrupted ({type(exc).__name__})") from None
        return cls(tensors, meta)
