"""Forward hooks that collect calibration statistics without changing the model's outputs."""

from __future__ import annotations

import torch

from laquant.errors import LaquantError


def _check_finite(name: str, what: str, x: torch.Tensor) -> None:
    if not torch.isfinite(x).all():
        raise LaquantError(f"NaN/Inf in the {what} of {name} during calibration; check the model weights "
                           "and the calibration data (a model that overflows in this dtype: try --dtype float32)")


# Percentiles come from per-channel histograms of log2|x| (BINS_PER_OCTAVE bins per octave from
# 2^-12 to 2^12; values beyond count in the end bins, zeros in the lowest): the memory is
# channels x bins x 4 bytes whatever the number of tokens, and the result does not depend on the
# order in which tokens arrive (whole model or layer by layer, any batch size). A quantile is read
# off by interpolating log2|x| within its bin, within 2^(1/BINS_PER_OCTAVE) - 1 = 9% of the exact
# one (tests/test_calibrate.py measures it); the percentiles only describe (reports, plots): no
# decision reads them.
BINS_PER_OCTAVE = 8
_LOG2_RANGE = 12
_MAG_BINS = 2 * _LOG2_RANGE * BINS_PER_OCTAVE  # magnitude bins; index 0 covers [0, 2^-12]


def _magnitude_bin(a: torch.Tensor) -> torch.Tensor:
    """The log2 bin of |x| ``a`` (int64, 0 .. _MAG_BINS - 1)."""
    b = torch.floor((torch.log2(a) + _LOG2_RANGE) * BINS_PER_OCTAVE)
    return b.nan_to_num_(0.0, 0.0, 0.0).clamp_(0, _MAG_BINS - 1).long()  # log2(0) = -inf: the lowest bin


def _bin_edges_log2(i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lo = i.double() / BINS_PER_OCTAVE - _LOG2_RANGE
    return lo, lo + 1.0 / BINS_PER_OCTAVE


class LogHistogram:
    """Per-channel histogram of values (``signed``) or magnitudes, for quantiles; ``[channels, bins]``
    int32 counts (2^31 - 1 tokens per channel at most), updated in place."""

    def __init__(self, channels: int, signed: bool):
        self.signed = signed
        self.bins = 2 * _MAG_BINS if signed else _MAG_BINS
        self.counts = torch.zeros(channels, self.bins, dtype=torch.int32)

    def add(self, x: torch.Tensor) -> None:
        """``x [rows, channels]``."""
        idx = _magnitude_bin(x.abs())
        if self.signed:  # ordered by value: most negative first, then zero and up, then positive
            idx = torch.where(x < 0, _MAG_BINS - 1 - idx, _MAG_BINS + idx)
        idx += torch.arange(x.shape[1], device=x.device) * self.bins
        counts = torch.bincount(idx.flatten(), minlength=self.counts.numel()).view_as(self.counts)
        if int(self.counts.sum(-1).max()) + x.shape[0] >= 2**31:
            raise LaquantError("more than 2^31 calibration tokens per channel; use fewer --samples")
        self.counts += counts.cpu()

    def quantile(self, q: float) -> torch.Tensor:
        """Per channel, the value below which a fraction ``q`` of the values lie (interpolated
        log-linearly within its bin)."""
        cdf = self.counts.long().cumsum(-1)
        total = cdf[:, -1:]
        rank = (q * total.double()).clamp_min(1e-9)
        i = torch.searchsorted(cdf.double(), rank).clamp_(max=self.bins - 1)  # first bin reaching the rank
        before = torch.where(i > 0, cdf.gather(-1, (i - 1).clamp_min(0)), torch.zeros_like(i)).double()
        inside = self.counts.gather(-1, i).double().clamp_min(1)
        frac = ((rank - before) / inside).clamp(0, 1)
        if self.signed:
            negative = i < _MAG_BINS
            mag_i = torch.where(negative, _MAG_BINS - 1 - i, i - _MAG_BINS)
            frac = torch.where(negative, 1 - frac, frac)  # a negative bin is walked from its larger magnitude
        else:
            negative, mag_i = torch.zeros_like(i, dtype=torch.bool), i
        lo, hi = _bin_edges_log2(mag_i)
        value = torch.exp2(lo + frac * (hi - lo))
        value = torch.where(mag_i == 0, value * frac, value)  # the lowest bin holds the zeros: linear down to 0
        value = torch.where(negative, -value, value)
        return torch.where(total > 0, value, torch.zeros_like(value)).squeeze(-1).float()


# |x| levels the projections' over-level counts are kept at: 2^k and 1.5 * 2^k from 1/64 to 12288,
# so a recipe's outlier threshold (6.0 by default, any such level exactly) is read off when planning
# or reporting, and the statistics do not depend on the recipe they were collected for
_LEVEL_EXPONENTS = range(-6, 14)
MAGNITUDE_LEVELS = torch.tensor(sorted(m * 2.0 ** k for k in _LEVEL_EXPONENTS for m in (1.0, 1.5)))


def levels_below(a: torch.Tensor) -> torch.Tensor:
    """How many of :data:`MAGNITUDE_LEVELS` lie below each finite ``|x|`` (``torch.bucketize`` against them,
    exactly, from the float's exponent and mantissa: a few cheap passes instead of a search)."""
    mantissa, exponent = torch.frexp(a)  # a = mantissa * 2^exponent, mantissa in [0.5, 1)
    lo, hi = _LEVEL_EXPONENTS[0], _LEVEL_EXPONENTS[-1]
    below = 2 * (exponent - (1 + lo)).clamp_(0, hi - lo + 1)  # 2^k and 1.5 * 2^k for every k <= exponent - 2
    inside = ((mantissa > 0.5).int() + (mantissa > 0.75).int()) * ((exponent >= lo + 1) & (exponent <= hi + 1))
    return (below + inside) * (a > 0)  # within [2^(e-1), 2^e): 2^(e-1) and 1.5 * 2^(e-1)


class ProjectionObserver:
    """Input channels of a linear: absmax, 99.9th percentile of |x|, and how often |x| exceeds each
    of :data:`MAGNITUDE_LEVELS`."""

    def __init__(self, name: str, module: torch.nn.Linear):
        self.name, self.channels = name, module.in_features
        self.absmax = self.hist = self.magnitudes = None  # allocated at the first call (layer by layer: when its layer runs)
        self.tokens = 0
        self.weight_min = self.weight_max = None
        if not module.weight.is_meta:  # a model streamed from its files (laquant.streaming): read at the first call
            self._read_weight(module)

    def _read_weight(self, module) -> None:
        w = module.weight.detach().float()
        self.weight_min, self.weight_max = w.amin(1).cpu(), w.amax(1).cpu()

    def _allocate(self) -> None:
        n = self.channels
        self.absmax = torch.zeros(n)
        self.hist = torch.zeros(n * (len(MAGNITUDE_LEVELS) + 1), dtype=torch.int64)  # [channel, level bin], flat
        self.magnitudes = LogHistogram(n, signed=False)

    def __call__(self, module, args):
        if self.weight_min is None:
            self._read_weight(module)
        if self.absmax is None:
            self._allocate()
        x = args[0].detach().reshape(-1, args[0].shape[-1])
        a = x.abs().float()
        amax = a.amax(0)
        _check_finite(self.name, "input", amax)  # a NaN or Inf anywhere reaches the channel's max
        # every statistic is updated in place: nothing is allocated per call that outlives it
        torch.maximum(self.absmax, amax.cpu(), out=self.absmax)
        bins = levels_below(a)
        offsets = torch.arange(a.shape[1], dtype=torch.int32, device=a.device) * (len(MAGNITUDE_LEVELS) + 1)
        self.hist += torch.bincount((bins + offsets).flatten(), minlength=self.hist.numel()).cpu()
        self.tokens += a.shape[0]
        self.magnitudes.add(a)

    def result(self) -> dict[str, torch.Tensor]:
        if self.absmax is None:  # never called: no tokens seen
            self._allocate()
        return {"act_absmax": self.absmax, "act_p999": torch.minimum(self.magnitudes.quantile(0.999), self.absmax),
                "act_over_levels": self._over_levels(),
                "weight_min": self.weight_min, "weight_max": self.weight_max}

    def _over_levels(self) -> torch.Tensor:
        """``[channels, levels]``: the fraction of tokens whose |x| exceeds each level."""
        hist = self.hist.view(-1, len(MAGNITUDE_LEVELS) + 1)
        over = hist.flip(-1).cumsum(-1).flip(-1)[:, 1:]  # tokens in the bins above each level
        return (over.double() / max(self.tokens, 1)).float()


class GateObserver:
    """Gate logits per output channel: range and tail percentiles, and the log-decay they give.
    ``channels = (first, count)``: the gate is that slice of a fused projection's outputs."""

    def __init__(self, name: str, to_log_decay, channels: tuple[int, int] | None = None):
        self.name, self.to_log_decay, self.channels = name, to_log_decay, channels
        self.min = self.max = self.values = None

    def __call__(self, module, args, output):
        y = output.detach().reshape(-1, output.shape[-1]).float()
        if self.channels is not None:
            y = y[:, self.channels[0]:self.channels[0] + self.channels[1]]
        lo, hi = y.amin(0).cpu(), y.amax(0).cpu()
        _check_finite(self.name, "output", hi - lo)  # a NaN or Inf anywhere reaches the channel's range
        if self.min is None:
            self.min, self.max, self.values = lo, hi, LogHistogram(y.shape[1], signed=True)
        else:
            torch.minimum(self.min, lo, out=self.min)
            torch.maximum(self.max, hi, out=self.max)
        self.values.add(y)

    def result(self) -> dict[str, torch.Tensor]:
        return {"logit_min": self.min, "logit_max": self.max,
                "logit_p001": self.values.quantile(0.001).clamp(self.min, self.max),
                "logit_p999": self.values.quantile(0.999).clamp(self.min, self.max),
                "log_decay_min": self.to_log_decay(self.min), "log_decay_max": self.to_log_decay(self.max)}


class StateObserver:
    """A mixer's recurrent state, read at checkpoints: absmax per head and K row, over time."""

    def __init__(self, name: str):
        self.name = name
        self.trajectory: dict[int, torch.Tensor] = {}  # token position -> [H, K] absmax (max over sequences)

    def observe(self, position: int, state: torch.Tensor) -> None:
        _check_finite(self.name, "recurrent state", state)
        amax = state.detach().abs().amax(dim=(0, -1)).float().cpu()  # [H, K]
        if position in self.trajectory:
            torch.maximum(self.trajectory[position], amax, out=self.trajectory[position])
        else:
            self.trajectory[position] = amax

    def result(self) -> dict[str, torch.Tensor]:
        positions = sorted(self.trajectory)
        traj = torch.stack([self.trajectory[p] for p in positions])
        half = len(positions) // 2
        span = max(positions[-1] - positions[half], 1)
        growth = (traj[-1].clamp_min(1e-30).log() - traj[half].clamp_min(1e-30).log()) / span * 1000.0
        return {"state_absmax": traj.amax(0), "state_trajectory": traj, "state_growth": growth,
                "checkpoints": torch.tensor(positions, dtype=torch.float32)}
