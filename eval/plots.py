"""PNG plots of calibration statistics: outlier channels, gate ranges, state magnitude over time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from laquant.calibration.stats import Stats


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def _finish_line_plot(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def _by_suffix(names: list[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(n.rsplit(".", 1)[-1], []).append(n)
    return groups


def plot_outliers(stats: Stats, path: Path, threshold: float | None) -> None:
    """Heatmaps of per-input-channel absmax, one panel per projection kind, layers as rows."""
    plt = pyplot()
    groups = _by_suffix([n for n in stats.modules("projections") if n != "lm_head"])
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 2.0 * len(groups) + 0.5), squeeze=False)
    for ax, (kind, names) in zip(axes[:, 0], sorted(groups.items())):
        rows = [stats.get(n, "act_absmax").numpy() for n in names]
        grid = np.full((len(rows), max(len(r) for r in rows)), np.nan)  # widths differ in MoE/hybrid layers
        for i, r in enumerate(rows):
            grid[i, :len(r)] = r
        im = ax.imshow(np.log10(np.maximum(grid, 1e-3)), aspect="auto", cmap="magma", interpolation="nearest")
        title = f"{kind} input: log10 |x| max per channel"
        if threshold:
            title += f"  ({int(np.nansum(grid > threshold))} channel-layers > {threshold:g})"
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("layer")
        fig.colorbar(im, ax=ax, fraction=0.02)
    axes[-1, 0].set_xlabel("input channel")
    save_figure(fig, path)


def plot_gates(stats: Stats, path: Path) -> None:
    """Per layer and channel: the calibrated gate-logit range and the 0.1-99.9 percentile band."""
    plt = pyplot()
    names = stats.modules("gates")
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 1.8 * len(names) + 0.5), squeeze=False, sharex=True)
    for ax, name in zip(axes[:, 0], names):
        lo, hi = stats.get(name, "logit_min").numpy(), stats.get(name, "logit_max").numpy()
        p_lo, p_hi = stats.get(name, "logit_p001").numpy(), stats.get(name, "logit_p999").numpy()
        x = np.arange(len(lo))
        ax.vlines(x, lo, hi, color="tab:red", lw=1, label="min..max")
        ax.vlines(x, p_lo, p_hi, color="tab:blue", lw=3, label="p0.1..p99.9")
        ax.set_ylabel(name.split(".")[2] if name.count(".") > 2 else name, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0, 0].set_title("gate logits per channel (decay = sigmoid(logit)^(1/16))", fontsize=9)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("gate channel (head-major)")
    save_figure(fig, path)


def plot_state(stats: Stats, path: Path) -> None:
    """State absmax per head over the calibration sequence, one panel per layer."""
    plt = pyplot()
    names = stats.modules("mixers")
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows + 0.4), squeeze=False)
    for ax, name in zip(axes.flat, names):
        traj = stats.get(name, "state_trajectory").numpy()  # [checkpoints, H, K]
        pos = stats.get(name, "checkpoints").numpy()
        for h in range(traj.shape[1]):
            ax.plot(pos, traj[:, h].max(-1), label=f"head {h}")
        ax.set_yscale("log")
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("tokens", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=6)
    axes[0, 0].set_ylabel("state absmax")
    save_figure(fig, path)


def plot_loss_by_position(series: dict[str, list[float]], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, values in series.items():
        ax.plot(*_smoothed(values), label=label)
    ax.set_xscale("log")
    _finish_line_plot(fig, ax, path, "position in window", "mean NLL (nats)", title)


def _smoothed(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Positions 1.. and a moving average over 1/64 of the window (the curves are noisy per token)."""
    v = np.array(values[1:], dtype=np.float64)
    window = max(1, len(v) // 64)
    smooth = np.convolve(v, np.ones(window) / window, mode="valid")
    return np.arange(1, len(smooth) + 1) + window // 2, smooth


def plot_drift(pairs: dict[str, tuple[list[float], list[float]]], path: Path, title: str) -> None:
    """For each label, loss by position of a series minus its baseline's (``(values, baseline)``):
    the drift of a quantized state."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (values, baseline) in pairs.items():
        x, smooth = _smoothed(list(np.array(values, dtype=np.float64) - np.array(baseline, dtype=np.float64)))
        ax.plot(x, smooth, label=label)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xscale("log")
    _finish_line_plot(fig, ax, path, "position in window", "NLL minus baseline (nats)", title)


def plot_saturation_by_position(series: dict[str, dict], path: Path, title: str) -> None:
    """For each label, a saturation result's (:mod:`laquant.eval.saturation`) fraction of the
    stored state at its format's limit and of gate logits clamped, by position."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for label, sat in series.items():
        x = np.arange(len(sat["state_at_limit_fraction_by_position"])) * sat["bucket"]
        top.plot(x[1:-1], sat["state_at_limit_fraction_by_position"][1:-1], label=label)  # the last: no step
        bottom.plot(x[1:-1], sat["gate_clamped_fraction_by_position"][1:-1], label=label)
    top.set_ylabel("state at its limit (fraction)")
    top.set_xscale("log")
    top.grid(alpha=0.3)
    top.legend(fontsize=7)
    top.set_title(title)
    _finish_line_plot(fig, bottom, path, "position in window", "gate logits clamped (fraction)", "")


def plot_training_history(history: dict, path: Path, title: str) -> None:
    """Training loss per logged batch and validation loss, against tokens seen."""
    fig, ax = pyplot().subplots(figsize=(7, 4))
    ax.plot(np.array(history["tokens"]) / 1e6, history["loss"], label="train (batch)", alpha=0.7)
    per_step = history["tokens"][0] / (history["step"][0] + 1)
    ax.plot((np.array(history["val_step"]) + 1) * per_step / 1e6, history["val_loss"], "o-", label="validation")
    _finish_line_plot(fig, ax, path, "tokens (M)", "cross-entropy (nats)", title)


def write_stat_plots(stats: Stats, folder: Path, threshold: float | None) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "outliers.png", folder / "gates.png", folder / "state.png"]
    plot_outliers(stats, paths[0], threshold)
    plot_gates(stats, paths[1])
    plot_state(stats, paths[2])
    return paths
