"""``laquant inspect PATH``: per-layer summary and plots of a laquant checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

from laquant.cli.common import add_to_folder
from laquant.errors import LaquantError
from laquant.paths import resolve_model_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a folder written by `laquant calibrate`")
    p.add_argument("--plots", default=None, help="folder for the PNG plots (default: PATH/plots)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking the files against their sha256 digests (laquant.json)")


def run(args: argparse.Namespace) -> int:
    folder = resolve_model_dir(args.path)
    from laquant.calibration.stats import Stats
    from laquant.checkpoint import read_quantization_config
    from laquant.eval.plots import write_stat_plots
    from laquant.eval.report import layer_summary
    from laquant.integrity import verify_checkpoint

    qcfg = read_quantization_config(folder)
    if qcfg is None:
        raise LaquantError(f"{folder} is not a laquant checkpoint (no quantization_config in config.json); "
                           "run `laquant calibrate` first")
    verify_checkpoint(folder, False if args.no_verify else None)
    stats = Stats.load(folder / "stats.safetensors")
    recipe = qcfg["recipe"]
    print(f"# {folder}: recipe {recipe['name']} — {recipe['description']}\n")
    print(layer_summary(stats, qcfg["decisions"], recipe["projections"]))
    plots_dir = Path(args.plots) if args.plots else folder / "plots"
    if args.plots:
        plots_dir.mkdir(parents=True, exist_ok=True)
        paths = write_stat_plots(stats, plots_dir, recipe["projections"]["outlier_threshold"])
    else:
        add_to_folder(folder, {}, lambda tmp: write_stat_plots(stats, tmp / "plots",
                                                               recipe["projections"]["outlier_threshold"]))
        paths = sorted(plots_dir.glob("*.png"))
    print("\nplots: " + ", ".join(str(p) for p in paths))
    return 0
