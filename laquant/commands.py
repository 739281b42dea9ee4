"""``laquant calibrate`` and ``laquant inspect``: the user's main path, end to end."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from laquant.errors import LaquantError


def run_calibrate(args: argparse.Namespace, device: str) -> int:
    from laquant.adapters import get_adapter
    from laquant.api import calibrate, save
    from laquant.calibration.run import calibration_batches
    from laquant.calibration.stats import Stats
    from laquant.checkpoint import check_out_dir
    from laquant.data import load_text, tokenize
    from laquant.eval.plots import write_stat_plots
    from laquant.eval.ppl import default_stride, perplexity_by_mode, strided_windows
    from laquant.eval.report import comparison_table, model_bytes, report_markdown, state_bytes_per_sequence
    from laquant.loading import load_model, load_tokenizer, read_supported_config, resolve_model_dir
    from laquant.recipe import load_recipe

    # everything that can be wrong with the input is checked before any expensive work
    recipe = load_recipe(args.recipe, args.set)
    out = Path(args.out or f"laquant-{recipe['name']}")
    check_out_dir(out, args.overwrite)
    model_dir = resolve_model_dir(args.model)
    read_supported_config(model_dir)
    tokenizer = load_tokenizer(model_dir)
    stats = Stats.load(args.stats) if args.stats else None
    batches = None
    if stats is None:
        calib_ids = tokenize(load_text(args.data), tokenizer)
        if len(calib_ids) == 0:
            raise LaquantError(f"calibration data {args.data!r} has no tokens")
        batches = calibration_batches(calib_ids, args.samples, args.seq_len, args.seed)
    eval_ids = None
    if not args.no_eval:
        eval_ids = tokenize(load_text(args.eval_data), tokenizer)[: args.eval_max_tokens]
        strided_windows(len(eval_ids), args.eval_context, default_stride(args.eval_context))

    home = "cpu" if args.offload else device  # --offload: the model waits in CPU memory
    model, _ = load_model(model_dir, device=home)
    mixers = {n: vars(i) for n, i in get_adapter(model).mixers().items()}

    def evaluate(m, label: str) -> dict:
        m.to(device)
        row = {}
        for mode, res in perplexity_by_mode(m, eval_ids, args.eval_context, args.eval_mode, args.batch_size,
                                            not args.quiet).items():
            row[mode] = res.ppl
            row[f"{mode}_loss_by_position"] = res.loss_by_position
            if not args.quiet:
                print(f"  {label} {mode}: ppl {res.ppl:.3f}", flush=True)
        m.to(home)
        return row

    base = evaluate(model, "bf16") if eval_ids is not None else {}
    base.update(model_bytes=model_bytes(model), state_bytes=state_bytes_per_sequence(mixers, None))
    result = calibrate(model, recipe, data=batches, stats=stats, seed=args.seed, progress=not args.quiet,
                       layerwise_device=device if args.offload else None)
    quant = evaluate(model, recipe["name"]) if eval_ids is not None else {}
    quant.update(model_bytes=model_bytes(model), state_bytes=state_bytes_per_sequence(mixers, result.decisions))
    rows = [("bf16", base), (recipe["name"], quant)]

    table = comparison_table(rows)
    note = (f"Perplexity on `{args.eval_data}`, first {len(eval_ids)} tokens, context {args.eval_context}, "
            f"stride {default_stride(args.eval_context)}; prefill = chunked path, decode = token by token with "
            f"the state carried." if eval_ids is not None else "Perplexity not evaluated (--no-eval).")
    calib_info = {"samples": result.stats.meta["samples"], "seq_len": result.stats.meta["seq_len"],
                  "data": args.data if args.stats is None else f"stats from {args.stats}", "seed": args.seed}
    report = report_markdown(recipe, str(model_dir), calib_info, table, result.stats, result.decisions, note)
    save(result, out, tokenizer=tokenizer, report=report, overwrite=args.overwrite)
    summary = {"recipe": recipe["name"], "model": str(model_dir), "out": str(out),
               "rows": [{"name": n, **{k: v for k, v in r.items() if not k.endswith("by_position")}} for n, r in rows]}
    _add_to_folder(out, {"eval.json": json.dumps(summary, indent=2) + "\n"},
                   lambda tmp: write_stat_plots(result.stats, tmp / "plots", recipe["projections"]["outlier_threshold"]))
    print(f"\n{note}\n\n{table}\n\nwrote {out}/ (model.safetensors, config.json, recipe.yaml, stats.safetensors, "
          f"report.md, plots/)")
    return 0


def _add_to_folder(folder: Path, files: dict[str, str], build=None) -> None:
    """Add files (and whatever ``build(tmp)`` writes) to an existing folder, each moved in whole."""
    with tempfile.TemporaryDirectory(dir=folder, prefix=".partial-") as tmp:
        tmp = Path(tmp)
        for name, text in files.items():
            (tmp / name).write_text(text)
        if build is not None:
            build(tmp)
        for item in tmp.iterdir():
            target = folder / item.name
            if target.is_dir():
                shutil.rmtree(target)
            item.replace(target)


def run_inspect(args: argparse.Namespace) -> int:
    from laquant.calibration.stats import Stats
    from laquant.checkpoint import read_quantization_config
    from laquant.eval.plots import write_stat_plots
    from laquant.eval.report import layer_summary
    from laquant.loading import resolve_model_dir

    folder = resolve_model_dir(args.path)
    qcfg = read_quantization_config(folder)
    if qcfg is None:
        raise LaquantError(f"{folder} is not a laquant checkpoint (no quantization_config in config.json); "
                           "run `laquant calibrate` first")
    stats = Stats.load(folder / "stats.safetensors")
    recipe = qcfg["recipe"]
    print(f"# {folder}: recipe {recipe['name']} — {recipe['description']}\n")
    print(layer_summary(stats, qcfg["decisions"]))
    plots_dir = Path(args.plots) if args.plots else folder / "plots"
    if args.plots:
        plots_dir.mkdir(parents=True, exist_ok=True)
        paths = write_stat_plots(stats, plots_dir, recipe["projections"]["outlier_threshold"])
    else:
        _add_to_folder(folder, {}, lambda tmp: write_stat_plots(stats, tmp / "plots",
                                                                recipe["projections"]["outlier_threshold"]))
        paths = sorted(plots_dir.glob("*.png"))
    print("\nplots: " + ", ".join(str(p) for p in paths))
    return 0


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", required=True, help="recipe name (see recipes/) or path to a YAML file")
    p.add_argument("--model", default=None, help="model directory or Hugging Face id (default: embedded gla-small)")
    p.add_argument("--data", default="calibration",
                   help="calibration text: 'calibration' (shipped mix), 'wikitext2', a text file or a datasets id")
    p.add_argument("--samples", type=int, default=128, help="calibration sequences")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per calibration sequence")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a recipe field, e.g. --set state.format=fp32 (repeatable)")
    p.add_argument("--stats", default=None, help="reuse statistics (stats.safetensors) instead of calibrating")
    p.add_argument("--out", default=None, help="output folder (default: ./laquant-<recipe>)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    p.add_argument("--eval-data", default="wikitext2")
    p.add_argument("--eval-context", type=int, default=2048)
    p.add_argument("--eval-max-tokens", type=int, default=32768,
                   help="evaluate on the first N tokens (default 32768; use `laquant eval ppl OUT` for all)")
    p.add_argument("--eval-mode", nargs="+", choices=["prefill", "decode"], default=["prefill", "decode"])
    p.add_argument("--no-eval", action="store_true", help="skip the perplexity comparison")
    p.add_argument("--batch-size", type=int, default=None,
                   help="windows run together (default: 4 in prefill, 64 in decode mode)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--offload", action="store_true",
                   help="keep the model in CPU memory and calibrate one decoder layer at a time on --device "
                        "(for models larger than the device; the perplexity comparison still moves the "
                        "whole model there: add --no-eval if it does not fit)")
    p.add_argument("--quiet", action="store_true")
