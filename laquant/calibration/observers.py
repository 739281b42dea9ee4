"""Forward hooks that collect calibration statistics without changing the model's outputs."""

from __future__ import annotations

import torch

from laquant.errors import LaquantError


def _check_finite(name: str, what: str, x: torch.Tensor) -> None:
    if not torch.isfinite(x).all():
        raise LaquantError(f"NaN/Inf in the {what} of {name} during calibration; check the model weights "
                           "and the calibration data (a model that overflows in this dtype: try --dtype float32)")


class _Sampler:
    """A bounded random sample of rows, for percentiles (exact percentiles would need every token)."""

    def __init__(self, rows_per_call: int, generator: torch.Generator):
        self.rows_per_call, self.gen, self.parts = rows_per_call, generator, []

    def add(self, rows: torch.Tensor) -> None:
        if rows.shape[0] > self.rows_per_call:
            rows = rows[torch.randperm(rows.shape[0], generator=self.gen)[: self.rows_per_call]]
        self.parts.append(rows.to(torch.float16 if rows.abs().max() < 6e4 else torch.float32).cpu())

    def quantile(self, q: float) -> torch.Tensor:
        return torch.quantile(torch.cat(self.parts).float(), q, dim=0)


# |x| levels the projections' over-level counts are kept at: 2^k and 1.5 * 2^k from 1/64 to 12288,
# so a recipe's outlier threshold (6.0 by default, any such level exactly) is read off when planning
# or reporting, and the statistics do not depend on the recipe they were collected for
MAGNITUDE_LEVELS = torch.tensor(sorted(m * 2.0 ** k for k in range(-6, 14) for m in (1.0, 1.5)))


class ProjectionObserver:
    """Input channels of a linear: absmax, 99.9th percentile of |x|, and how often |x| exceeds each
    of :data:`MAGNITUDE_LEVELS`."""

    def __init__(self, name: str, module: torch.nn.Linear, gen: torch.Generator):
        self.name = name
        n = module.in_features
        self.absmax = torch.zeros(n)
        self.hist = torch.zeros(n * (len(MAGNITUDE_LEVELS) + 1), dtype=torch.int64)  # [channel, level bin], flat
        self.tokens = 0
        self.sample = _Sampler(16, gen)
        w = module.weight.detach().float()
        self.weight_min, self.weight_max = w.amin(1).cpu(), w.amax(1).cpu()

    def __call__(self, module, args):
        x = args[0].detach().reshape(-1, args[0].shape[-1])
        _check_finite(self.name, "input", x)
        a = x.abs().float()
        self.absmax = torch.maximum(self.absmax, a.amax(0).cpu())
        bins = torch.bucketize(a, MAGNITUDE_LEVELS.to(a.device), out_int32=True)  # how many levels lie below |x|
        offsets = torch.arange(a.shape[1], dtype=torch.int32, device=a.device) * (len(MAGNITUDE_LEVELS) + 1)
        self.hist = self.hist.to(a.device) + torch.bincount((bins + offsets).flatten(), minlength=self.hist.numel())
        self.tokens += a.shape[0]
        self.sample.add(a)

    def result(self) -> dict[str, torch.Tensor]:
        return {"act_absmax": self.absmax, "act_p999": self.sample.quantile(0.999),
                "act_over_levels": self._over_levels(),
                "weight_min": self.weight_min, "weight_max": self.weight_max}

    def _over_levels(self) -> torch.Tensor:
        """``[channels, levels]``: the fraction of tokens whose |x| exceeds each level."""
        hist = self.hist.cpu().view(-1, len(MAGNITUDE_LEVELS) + 1)
        over = hist.flip(-1).cumsum(-1).flip(-1)[:, 1:]  # tokens in the bins above each level
        return (over.double() / max(self.tokens, 1)).float()


class GateObserver:
    """Gate logits per output channel: range and tail percentiles, and the log-decay they give.
    ``channels = (first, count)``: the gate is that slice of a fused projection's outputs."""

    def __init__(self, name: str, to_log_decay, gen: torch.Generator, channels: tuple[int, int] | None = None):
        self.name, self.to_log_decay, self.channels = name, to_log_decay, channels
        self.min = self.max = None
        self.sample = _Sampler(128, gen)

    def __call__(self, module, args, output):
        y = output.detach().reshape(-1, output.shape[-1]).float()
        if self.channels is not None:
            y = y[:, self.channels[0]:self.channels[0] + self.channels[1]]
        _check_finite(self.name, "output", y)
        lo, hi = y.amin(0).cpu(), y.amax(0).cpu()
        self.min = lo if self.min is None else torch.minimum(self.min, lo)
        self.max = hi if self.max is None else torch.maximum(self.max, hi)
        self.sample.add(y)

    def result(self) -> dict[str, torch.Tensor]:
        return {"logit_min": self.min, "logit_max": self.max,
                "logit_p001": self.sample.quantile(0.001), "logit_p999": self.sample.quantile(0.999),
                "log_decay_min": self.to_log_decay(self.min), "log_decay_max": self.to_log_decay(self.max)}


class StateObserver:
    """A mixer's recurrent state, read at checkpoints: absmax per head and K row, over time."""

    def __init__(self, name: str):
        self.name = name
        self.trajectory: dict[int, torch.Tensor] = {}  # token position -> [H, K] absmax (max over sequences)

    def observe(self, position: int, state: torch.Tensor) -> None:
        _check_finite(self.name, "recurrent state", state)
        amax = state.detach().abs().amax(dim=(0, -1)).float().cpu()  # [H, K]
        prev = self.trajectory.get(position)
        self.trajectory[position] = amax if prev is None else torch.maximum(prev, amax)

    def result(self) -> dict[str, torch.Tensor]:
        positions = sorted(self.trajectory)
        traj = torch.stack([self.trajectory[p] for p in positions])
        half = len(positions) // 2
        span = max(positions[-1] - positions[half], 1)
        growth = (traj[-1].clamp_min(1e-30).log() - traj[half].clamp_min(1e-30).log()) / span * 1000.0
        return {"state_absmax": traj.amax(0), "state_trajectory": traj, "state_growth": growth,
                "checkpoints": torch.tensor(positions, dtype=torch.float32)}
