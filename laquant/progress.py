"""The job-level progress line of ``laquant calibrate``: which phase runs and how long the whole
job still takes, estimated from measured work, not guessed.

Each phase counts work units of a kind: tokens through the model (prefill evaluation, calibration)
or decode steps (one token for every window of a batch). The time per unit of each kind is
measured: before the first phase by probes (a prefill window and a few decode steps of the bf16
model and of a throw-away quantized copy, a calibration window), then by the phases themselves
as they run. A kind not measured yet (the quantized model's, until it exists) borrows the rate of
the kind it stands in for, and the estimate says so with ``~`` until every remaining phase runs at
a measured rate. Export is not counted (a few seconds).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass


@dataclass
class Phase:
    name: str
    kind: str  # e.g. "prefill", "decode", "calibrate", "prefill_q", "decode_q"
    units: float  # tokens, or decode steps
    done: float = 0.0


class JobEstimate:
    """Remaining seconds of a job's phases from seconds-per-unit rates by kind.

    ``proxies`` maps a kind to the kind whose rate stands in for it until it is measured itself.
    A phase's own measurement counts once it has ``min_seconds`` of work behind it (the first steps
    carry one-off costs); before that the kind keeps its earlier rate (probe or proxy)."""

    def __init__(self, phases: list[Phase], proxies: dict[str, str] | None = None, min_seconds: float = 1.0):
        self.phases = phases
        self.proxies = proxies or {}
        self.min_seconds = min_seconds
        self.rates: dict[str, float] = {}  # kind -> seconds per unit, measured
        self._spent: dict[str, tuple[float, float]] = {}  # kind -> (seconds, units) measured in its phases

    def probe(self, kind: str, seconds: float, units: float) -> None:
        """A probe: ``units`` of ``kind`` took ``seconds``; the rate until the phases measure their own."""
        if units > 0 and self._spent.get(kind, (0.0, 0.0))[0] < self.min_seconds:
            self.rates[kind] = seconds / units

    def measure(self, kind: str, seconds: float, units: float) -> None:
        """A phase of ``kind`` did ``units`` more in ``seconds`` (accumulated over its phases)."""
        s, u = self._spent.get(kind, (0.0, 0.0))
        s, u = s + seconds, u + units
        self._spent[kind] = (s, u)
        if u > 0 and (s >= self.min_seconds or kind not in self.rates):
            self.rates[kind] = s / u

    def rate(self, kind: str) -> tuple[float | None, bool]:
        """``(seconds per unit, measured)``: the kind's own, else its proxy's (not measured)."""
        if kind in self.rates:
            return self.rates[kind], True
        seen = set()
        while kind in self.proxies and kind not in seen:
            seen.add(kind)
            kind = self.proxies[kind]
            if kind in self.rates:
                return self.rates[kind], False
        return None, False

    def remaining(self) -> tuple[float | None, bool]:
        """``(seconds, exact)``: None while some remaining phase has no rate at all; ``exact`` when
        every remaining phase runs at its own measured rate."""
        total, exact = 0.0, True
        for p in self.phases:
            left = max(p.units - p.done, 0.0)
            if left == 0:
                continue
            r, measured = self.rate(p.kind)
            if r is None:
                return None, False
            total += left * r
            exact &= measured
        return total, exact


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class JobProgress:
    """One line above the phases' own bars: ``job: phase 2/5 calibration | 1:23 elapsed | ETA 2:41``."""

    def __init__(self, phases: list[Phase], proxies: dict[str, str] | None = None, enabled: bool = True,
                 now=time.perf_counter):
        self.estimate = JobEstimate(phases, proxies)
        self.now = now
        self.start = now()
        self.current: Phase | None = None
        self._mark = (self.start, 0.0)  # time and units of the last measurement in the current phase
        self.bar, self._shown = None, self.start
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=None, bar_format="{desc}", position=0, leave=False)
            self._show()

    def probe(self, kind: str, seconds: float, units: float) -> None:
        self.estimate.probe(kind, seconds, units)
        self._show()

    @contextlib.contextmanager
    def phase(self, name: str):
        """The named phase runs inside; work is reported with :meth:`advance`."""
        self.current = next(p for p in self.estimate.phases if p.name == name)
        self._mark = (self.now(), 0.0)
        self._show()
        try:
            yield self
        finally:
            self.current.done = self.current.units
            self.current = None
            self._show()

    def advance(self, units: float) -> None:
        p = self.current
        if p is None:
            return
        p.done += units
        t = self.now()
        self.estimate.measure(p.kind, t - self._mark[0], units)
        self._mark = (t, p.done)
        self._show(force=False)

    def line(self) -> str:
        phases = self.estimate.phases
        seconds, exact = self.estimate.remaining()
        where = "starting"
        if self.current is not None:
            where = f"phase {phases.index(self.current) + 1}/{len(phases)} {self.current.name}"
        elif any(p.done for p in phases):
            last = max(i for i, p in enumerate(phases) if p.done)
            where = f"after phase {last + 1}/{len(phases)} {phases[last].name}"
        eta = "ETA ?" if seconds is None else f"ETA {'' if exact else '~'}{clock(seconds)}"
        return f"job: {where} | {clock(self.now() - self.start)} elapsed | {eta}"

    def _show(self, force: bool = True) -> None:
        """Redraws the line: at once for a new phase or probe, at most twice a second for work."""
        if self.bar is None:
            return
        t = self.now()
        if force or t - self._shown >= 0.5:
            self._shown = t
            self.bar.set_description_str(self.line())

    def close(self) -> str:
        """Closes the line; returns the job's wall time as m:ss."""
        if self.bar is not None:
            self.bar.close()
        return clock(self.now() - self.start)
