"""The ``laquant`` command line: calibrate, eval ppl, eval speed, inspect."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from laquant.commands import add_calibrate_arguments, run_calibrate, run_inspect
from laquant.errors import LaquantError

SPEED_SUITES = ["decode", "prefill", "delta_decode", "delta_prefill", "gemm", "e2e"]  # laquant.eval.speed.SUITES
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def cmd_eval_speed(args: argparse.Namespace) -> int:
    from pathlib import Path

    from laquant.eval.speed import SUITES, markdown, run_speed

    suites = args.suite or list(SUITES)
    if args.checkpoint is not None:
        from laquant.loading import resolve_model_dir

        resolve_model_dir(args.checkpoint)  # a missing folder is named before any GPU work
    result = run_speed(Path(args.out), suites, models=args.model, recipe=args.recipe, quick=args.quick,
                       checkpoint=args.checkpoint, baseline=args.baseline, batches=args.batch,
                       prompt_len=args.prompt, steps=args.gen)
    print(markdown(result))
    print(f"\nwrote {args.out}/speed.json, speed.md" + (", speed.png" if set(suites) - {"gemm", "e2e"} else ""))
    return 0


def _pick_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise LaquantError("--device cuda was asked for, but no CUDA device is available; use --device cpu")
    return requested


def cmd_eval_ppl(args: argparse.Namespace) -> int:
    import torch

    from laquant.data import load_text, tokenize
    from laquant.api import load
    from laquant.eval.ppl import default_stride, perplexity, strided_windows
    from laquant.loading import load_tokenizer, read_supported_config, resolve_model_dir

    if args.max_tokens is not None and args.max_tokens < 2:
        raise LaquantError(f"--max-tokens must be at least 2, got {args.max_tokens}")
    device = _pick_device(args.device)
    dtype_name = DTYPES[args.dtype] if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    dtype = getattr(torch, dtype_name)
    model_dirs = {"model": resolve_model_dir(args.model)}
    if args.baseline is not None:
        model_dirs = {"baseline": resolve_model_dir(args.baseline), **model_dirs}
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
        model, _ = load(model_dir, device=device, dtype=dtype)
        for ctx in args.context:
            for mode in args.mode:
                res = perplexity(model, ids, context=ctx, stride=args.stride, mode=mode,
                                 batch_size=args.batch_size, progress=not args.quiet)
                results.append((label, model_dir, res))
        del model

    header = f"{'model':<9} {'mode':<8} {'context':>7} {'stride':>6} {'tokens':>8} {'nll':>8} {'ppl':>10} {'seconds':>8}"
    for label, d in model_dirs.items():
        print(f"{label}: {d}")
    print(f"data: {args.data} ({len(ids)} tokens)  device: {device}  dtype: {dtype_name}")
    print(header)
    print("-" * len(header))
    for label, _, r in results:
        print(f"{label:<9} {r.mode:<8} {r.context:>7} {r.stride:>6} {r.tokens_scored:>8} {r.nll:>8.4f} {r.ppl:>10.4f} "
              f"{r.seconds:>8.1f}")

    if args.json:
        payload = {
            "model": str(model_dirs["model"]), "data": args.data, "tokens": len(ids), "device": device,
            "dtype": dtype_name, "versions": _versions(),
            "results": [{"model": label, **r.to_dict()} for label, _, r in results],
        }
        if args.baseline is not None:
            payload["baseline"] = str(model_dirs["baseline"])
        _write_atomic(Path(args.json), json.dumps(payload, indent=2) + "\n")
    if args.plot:
        from laquant.eval.plots import plot_loss_by_position

        series = {f"{label} {r.mode} ctx={r.context}": r.loss_by_position for label, _, r in results}
        plot_loss_by_position(series, Path(args.plot), f"loss by position, {args.data}")
    return 0


def _versions() -> dict:
    import torch
    import transformers

    import laquant

    out = {"laquant": laquant.__version__, "torch": torch.__version__, "transformers": transformers.__version__}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="laquant", description=(
        "Post-training quantization for linear-attention and hybrid language models."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_cal = sub.add_parser("calibrate", help="calibrate and quantize a model with a recipe, export a checkpoint",
                           description="Collect activation, gate and state statistics, quantize by the recipe, "
                                       "compare perplexity with the unquantized model, and write OUT/.")
    add_calibrate_arguments(p_cal)
    p_cal.set_defaults(func=lambda a: run_calibrate(a, _pick_device(a.device)))

    p_inspect = sub.add_parser("inspect", help="per-layer summary and plots of a laquant checkpoint")
    p_inspect.add_argument("path", help="a folder written by `laquant calibrate`")
    p_inspect.add_argument("--plots", default=None, help="folder for the PNG plots (default: PATH/plots)")
    p_inspect.set_defaults(func=run_inspect)

    p_eval = sub.add_parser("eval", help="evaluate a model: perplexity or speed")
    eval_sub = p_eval.add_subparsers(dest="eval_command", required=True, metavar="WHAT")

    p_ppl = eval_sub.add_parser("ppl", help="perplexity in prefill and/or decode mode", description=(
        "Perplexity with strided windows. prefill: each window through the chunked path; "
        "decode: token by token through the recurrent path, state carried each step."))
    p_ppl.add_argument("model", nargs="?", default=None,
                       help="model directory or Hugging Face id (default: the embedded gla-small)")
    p_ppl.add_argument("--data", default="wikitext2",
                       help="'wikitext2' (shipped copy of the test split), a text file, or a datasets id "
                            "DATASET[:CONFIG] (test split)")
    p_ppl.add_argument("--context", type=int, nargs="+", default=[2048], help="window length(s) in tokens")
    p_ppl.add_argument("--stride", type=int, default=None, help="window step (default: context // 2)")
    p_ppl.add_argument("--mode", nargs="+", choices=["prefill", "decode"], default=["prefill", "decode"])
    p_ppl.add_argument("--max-tokens", type=int, default=None, help="evaluate on the first N tokens only")
    p_ppl.add_argument("--batch-size", type=int, default=None,
                       help="windows run together (default: 4 in prefill, 64 in decode mode)")
    p_ppl.add_argument("--device", default="cpu", help="cpu, cuda, or auto (default: cpu)")
    p_ppl.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                       help="compute dtype (default: float32 on CPU, bfloat16 on CUDA)")
    p_ppl.add_argument("--baseline", default=None, help="also evaluate this model (e.g. the unquantized one)")
    p_ppl.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p_ppl.add_argument("--plot", metavar="PNG", help="also plot loss by position in the window")
    p_ppl.add_argument("--quiet", action="store_true", help="no progress bars")
    p_ppl.set_defaults(func=cmd_eval_ppl)

    p_speed = eval_sub.add_parser("speed", help="kernel and end-to-end speed against fla, SDPA, cuBLAS, bitsandbytes",
                                  description="Benchmarks on the CUDA device, each against its peer in the same run "
                                              "(see laquant/eval/speed.py); writes OUT/speed.json, speed.md, speed.png.")
    p_speed.add_argument("checkpoint", nargs="?", default=None,
                         help="e2e: a folder written by `laquant calibrate` (timed as saved; default: "
                              "quantize --model with --recipe here)")
    p_speed.add_argument("--baseline", default=None, help="e2e: the unquantized model to compare the checkpoint with")
    p_speed.add_argument("--suite", nargs="+", choices=SPEED_SUITES,
                         help="what to measure (default: all)")
    p_speed.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64], help="e2e decode batch sizes")
    p_speed.add_argument("--prompt", type=int, default=4096, help="e2e prompt length in tokens")
    p_speed.add_argument("--gen", type=int, default=32, help="e2e decode steps timed")
    p_speed.add_argument("--model", nargs="+", default=["gla-small"],
                         help="models for the e2e suite: directories, HF ids, or config:{json} for a random "
                              "model of that GLAConfig (speed only)")
    p_speed.add_argument("--recipe", default="gla_int8", help="recipe for the quantized e2e model")
    p_speed.add_argument("--out", default="speed-results", help="output folder (replaced atomically)")
    p_speed.add_argument("--quick", action="store_true", help="a few shapes only (smoke test)")
    p_speed.set_defaults(func=cmd_eval_speed)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except LaquantError as exc:
        print(f"laquant: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("laquant: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
