"""Saturation counters for decode-mode runs: how often the stored recurrent state and the gate
logits hit their format's limit, by position in the sequence.

* state: after every step, the elements of every layer's stored state at the largest code of its
  format (int8: |code| = 127; int4: |code| = 7, on the unpacked codes; fp8 e4m3: |value| = 448),
  or, for the plain formats (fp32, bf16),
  overflowed past the dtype's largest finite value; and the non-finite elements. With dynamic
  scales (``renorm_interval >= 1``) each row's largest element lands on the limit by construction
  (nothing clips), so the telling number is the *fraction* of elements at the limit growing along
  the sequence; with static scales (``renorm_interval = 0``) an element at the limit was clipped.
* activations: the int8 gates' logits outside their calibrated range (clamped to it). The
  projections' activations are quantized per token with dynamic scales: their absmax lands on 127
  by construction and nothing clips, so they are not counted.

Counts accumulate on the model's device in buckets of ``bucket`` positions, the position itself a
device tensor: a step's counting reads nothing back to the host, so it can be captured in the CUDA
graph of a decode step (the graphed perplexity scorer does) and replayed.
"""

from __future__ import annotations

import torch

from laquant.adapters import get_adapter
from laquant.kernels.common.formats import get_format
from laquant.kernels.common.numerics import codes
from laquant.models.cache import state_store


def _at_limit(data: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(elements at the format's limit, non-finite elements)`` per batch row of stored state
    codes ``data [B, ...]`` (packed int4: of its unpacked codes)."""
    spec = get_format(fmt)
    values = codes(data).float()
    finite = torch.isfinite(values)
    if spec.is_scaled:
        at = (values.abs() >= spec.qmax) & finite
    else:
        at = values.abs() >= torch.finfo(data.dtype).max  # overflowed to the largest value (or inf)
    return at.flatten(1).sum(1), (~finite).flatten(1).sum(1)


class SaturationCounter:
    """Hooks on a model for one decode run of ``length`` positions; :meth:`after_step` after each
    step with the cache; :meth:`result` the counts as JSON-ready lists."""

    def __init__(self, model, length: int, bucket: int = 1):
        self.bucket = bucket
        n = -(-length // bucket)
        device = next(model.parameters()).device
        z = lambda: torch.zeros(n, dtype=torch.int64, device=device)  # noqa: E731
        self.state_at_limit, self.state_nonfinite, self.state_elements = z(), z(), z()
        self.gate_clamped, self.gate_elements = z(), z()
        self._last = n - 1
        self.position = torch.zeros(1, dtype=torch.int64, device=device)
        self.active = True  # False while a step runs that must not count (a graph's warm-up)
        self.rows = torch.full((1,), 2 ** 62, dtype=torch.int64, device=device)  # batch rows counted
        self.formats: set[str] = set()
        self._handles = []
        adapter = get_adapter(model)
        for name in adapter.gates():
            gate = adapter.module(name)
            if hasattr(gate, "logit_min") and getattr(gate, "clamp", False):
                self._handles.append(list(gate.children())[-1].register_forward_hook(self._gate_hook(gate)))

    def _gate_hook(self, gate):
        def hook(module, args, logits):
            if gate.channel_start is not None:
                logits = logits[..., gate.channel_start:gate.channel_start + gate.logit_min.numel()]
            if not self.active:
                return
            out = (logits < gate.logit_min) | (logits > gate.logit_max)
            self._add(self.gate_clamped, self.gate_elements, out.flatten(1).sum(1), out[0].numel())
        return hook

    def _add(self, counts: torch.Tensor, elements: torch.Tensor, per_row: torch.Tensor, row_numel: int,
             nonfinite: torch.Tensor | None = None) -> None:
        """Add the counted rows' ``per_row`` counts (and ``row_numel`` elements each) at the bucket of
        the current position; device ops only."""
        b = torch.clamp(self.position // self.bucket, max=self._last)
        counted = torch.arange(per_row.shape[0], device=per_row.device) < self.rows
        counts.index_add_(0, b, (per_row * counted).sum().view(1))
        elements.index_add_(0, b, counted.sum().view(1) * row_numel)
        if nonfinite is not None:
            self.state_nonfinite.index_add_(0, b, (nonfinite * counted).sum().view(1))

    _COUNTERS = ("state_at_limit", "state_nonfinite", "state_elements", "gate_clamped", "gate_elements", "position",
                 "rows")

    def save(self) -> dict:
        """A copy of the counts (to undo steps that are run again, see :meth:`load`)."""
        return {"formats": set(self.formats), **{k: getattr(self, k).clone() for k in self._COUNTERS}}

    def load(self, saved: dict) -> None:
        self.formats = set(saved["formats"])
        for k in self._COUNTERS:
            getattr(self, k).copy_(saved[k])

    def start_sequence(self, rows: int | None = None) -> None:
        """The next step is position 0 of new sequences; only the first ``rows`` batch rows count
        (a batch padded to a captured graph's size does not count its padding)."""
        self.position.zero_()
        self.rows.fill_(2 ** 62 if rows is None else rows)

    def after_step(self, cache) -> None:
        """Count the states stored by the step just run, at the current position."""
        if not self.active:
            return
        store = state_store(cache)
        states = store.states.values() if isinstance(store.states, dict) else store.states
        for s in states:
            if s is None:
                continue
            at, nonfinite = _at_limit(s.data, s.format)
            self._add(self.state_at_limit, self.state_elements, at, codes(s.data[:1]).numel(), nonfinite)
            self.formats.add(s.format)
        self.position += 1

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def result(self) -> dict:
        def frac(num, den):
            return (num.double() / den.clamp_min(1).double()).tolist()

        totals = {k: int(getattr(self, k).sum()) for k in
                  ("state_at_limit", "state_nonfinite", "state_elements", "gate_clamped", "gate_elements")}
        return {
            "state_formats": sorted(self.formats), "bucket": self.bucket, **totals,
            "state_at_limit_fraction": totals["state_at_limit"] / max(totals["state_elements"], 1),
            "gate_clamped_fraction": totals["gate_clamped"] / max(totals["gate_elements"], 1),
            "state_at_limit_by_position": self.state_at_limit.tolist(),
            "state_at_limit_fraction_by_position": frac(self.state_at_limit, self.state_elements),
            "state_nonfinite_by_position": self.state_nonfinite.tolist(),
            "gate_clamped_by_position": self.gate_clamped.tolist(),
            "gate_clamped_fraction_by_position": frac(self.gate_clamped, self.gate_elements),
        }
