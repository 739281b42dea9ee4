"""``laquant eval speed``: kernel and end-to-end benchmarks (laquant.eval.speed) on the CUDA device."""

from __future__ import annotations

import argparse
from pathlib import Path

from laquant.eval.speed import SUITES, markdown, run_speed
from laquant.loading import resolve_model_dir

SPEED_SUITES = list(SUITES)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?", default=None,
                   help="e2e: a folder written by `laquant calibrate` (timed as saved; default: "
                        "quantize --model with --recipe here)")
    p.add_argument("--baseline", default=None, help="e2e: the unquantized model to compare the checkpoint with")
    p.add_argument("--suite", nargs="+", choices=SPEED_SUITES,
                   help="what to measure (default: all)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64], help="e2e decode batch sizes")
    p.add_argument("--prompt", type=int, default=4096, help="e2e prompt length in tokens")
    p.add_argument("--gen", type=int, default=32, help="e2e decode steps timed")
    p.add_argument("--model", nargs="+", default=["gla-small"],
                   help="models for the e2e suite: directories, HF ids, or config:{json} for a random "
                        "model of that GLAConfig (speed only)")
    p.add_argument("--recipe", default="gla_int8", help="recipe for the quantized e2e model")
    p.add_argument("--out", default="speed-results", help="output folder (replaced atomically)")
    p.add_argument("--quick", action="store_true", help="a few shapes only (smoke test)")


def run(args: argparse.Namespace) -> int:
    suites = args.suite or list(SUITES)
    if args.checkpoint is not None:
        resolve_model_dir(args.checkpoint)  # a missing folder is named before any GPU work
    result = run_speed(Path(args.out), suites, models=args.model, recipe=args.recipe, quick=args.quick,
                       checkpoint=args.checkpoint, baseline=args.baseline, batches=args.batch,
                       prompt_len=args.prompt, steps=args.gen)
    print(markdown(result))
    print(f"\nwrote {args.out}/speed.json, speed.md" + (", speed.png" if set(suites) - {"gemm", "e2e"} else ""))
    return 0
