"""``laquant eval ppl``: perplexity of one model (and a baseline) in prefill and/or decode mode."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from laquant.cli.common import pick_device, versions, write_atomic
from laquant.errors import LaquantError
from laquant.paths import check_model_dir

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="model directory or Hugging Face id (default: the embedded gla-small)")
    p.add_argument("--data", default="wikitext2",
                   help="'wikitext2' (shipped copy of the test split), a text file, or a datasets id "
                        "DATASET[:CONFIG] (test split)")
    p.add_argument("--context", type=int, nargs="+", default=[2048], help="window length(s) in tokens")
    p.add_argument("--stride", type=int, default=None, help="window step (default: context // 2)")
    p.add_argument("--mode", nargs="+", choices=["prefill", "decode"], default=["prefill", "decode"])
    p.add_argument("--max-tokens", type=int, default=None, help="evaluate on the first N tokens only")
    p.add_argument("--batch-size", type=int, default=None,
                   help="windows run together (default: 4 in prefill, 64 in decode mode)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, or auto (default: cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                   help="compute dtype (default: float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--baseline", default=None, help="also evaluate this model (e.g. the unquantized one)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--plot", metavar="PNG", help="also plot loss by position in the window")
    p.add_argument("--plot-drift", metavar="PNG",
                   help="also plot the model's loss by position minus the baseline's (needs --baseline)")
    p.add_argument("--eager", action="store_true",
                   help="no CUDA graphs (by default on a GPU, decode mode replays one graph a token and prefill mode "
                        "one a batch, for the models laquant graphs)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking a checkpoint's files against its sha256 digests (laquant.json)")


def run(args: argparse.Namespace) -> int:
    if args.plot_drift and args.baseline is None:
        raise LaquantError("--plot-drift compares against a baseline: give --baseline MODEL")
    if args.max_tokens is not None and args.max_tokens < 2:
        raise LaquantError(f"--max-tokens must be at least 2, got {args.max_tokens}")
    model_dirs = {"model": check_model_dir(args.model)}
    if args.baseline is not None:
        model_dirs = {"baseline": check_model_dir(args.baseline), **model_dirs}
    import torch

    from laquant.api import load
    from laquant.data import load_text, tokenize
    from laquant.eval.plots import plot_drift, plot_loss_by_position
    from laquant.eval.ppl import default_stride, perplexity, strided_windows
    from laquant.loading import load_tokenizer, read_supported_config

    device = pick_device(args.device)
    dtype_name = DTYPES[args.dtype] if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    dtype = getattr(torch, dtype_name)
    for d in model_dirs.values():
        read_supported_config(d)
    text = load_text(args.data)
    ids = tokenize(text, load_tokenizer(model_dirs["model"]))
    if args.max_tokens is not None:
        ids = ids[: args.max_tokens]
    for ctx in args.context:  # every window plan is checked before any work starts
        strided_windows(len(ids), ctx, args.stride or default_stride(ctx))

    results = []
    for label, model_dir in model_dirs.items():
        model, _ = load(model_dir, device=device, dtype=dtype, verify=False if args.no_verify else None)
        for ctx in args.context:
            for mode in args.mode:
                res = perplexity(model, ids, context=ctx, stride=args.stride, mode=mode,
                                 batch_size=args.batch_size, progress=not args.quiet, graphed=not args.eager)
                results.append((label, model_dir, res))
        del model

    _print_table(model_dirs, results, args.data, len(ids), device, dtype_name)
    if args.json:
        payload = {
            "model": str(model_dirs["model"]), "data": args.data, "tokens": len(ids), "device": device,
            "dtype": dtype_name, "versions": versions(),
            "results": [{"model": label, **r.to_dict()} for label, _, r in results],
        }
        if args.baseline is not None:
            payload["baseline"] = str(model_dirs["baseline"])
        write_atomic(Path(args.json), json.dumps(payload, indent=2) + "\n")
    if args.plot:
        series = {f"{label} {r.mode} ctx={r.context}": r.loss_by_position for label, _, r in results}
        plot_loss_by_position(series, Path(args.plot), f"loss by position, {args.data}")
    if args.plot_drift:
        base = {(r.mode, r.context): r.loss_by_position_all for label, _, r in results if label == "baseline"}
        pairs = {f"{r.mode} ctx={r.context}": (r.loss_by_position_all, base[r.mode, r.context])
                 for label, _, r in results if label == "model"}
        plot_drift(pairs, Path(args.plot_drift), f"loss minus the baseline's by position, {args.data}")
    return 0


def _print_table(model_dirs: dict, results: list, data: str, n_tokens: int, device: str, dtype_name: str) -> None:
    header = f"{'model':<9} {'mode':<8} {'context':>7} {'stride':>6} {'tokens':>8} {'nll':>8} {'ppl':>10} {'seconds':>8}"
    for label, d in model_dirs.items():
        print(f"{label}: {d}")
    print(f"data: {data} ({n_tokens} tokens)  device: {device}  dtype: {dtype_name}")
    print(header)
    print("-" * len(header))
    for label, _, r in results:
        print(f"{label:<9} {r.mode:<8} {r.context:>7} {r.stride:>6} {r.tokens_scored:>8} {r.nll:>8.4f} {r.ppl:>10.4f} "
              f"{r.seconds:>8.1f}")
