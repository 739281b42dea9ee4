"""``laquant calibrate``: the user's main path. The arguments, the recipe, the output folder and the
model folder are checked here without torch or transformers, so a mistake is named at once; the
steps (:mod:`laquant.cli.calibrate_steps`) load them after."""

from __future__ import annotations

import argparse
from pathlib import Path

from laquant.cli.export import add_export_arguments
from laquant.errors import LaquantError
from laquant.export_options import check_exportable
from laquant.paths import check_model_dir, check_out_dir, read_config
from laquant.recipe import load_recipe


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", required=True, help="recipe name (see recipes/) or path to a YAML file")
    p.add_argument("--model", default=None, help="model directory or Hugging Face id (default: embedded gla-small)")
    p.add_argument("--data", default="calibration",
                   help="calibration text: 'calibration' (shipped mix), 'wikitext2', a text file or a datasets id")
    p.add_argument("--samples", type=int, default=128, help="calibration sequences")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per calibration sequence")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a recipe field, e.g. --set state.format=fp32, or the roles kept in high "
                        "precision, e.g. --set keep=embeddings,norms (lm_head quantized too) (repeatable)")
    p.add_argument("--stats", default=None, help="reuse statistics (stats.safetensors) instead of calibrating")
    p.add_argument("--out", default=None, help="output folder (default: ./laquant-<recipe>)")
    p.add_argument("--format", choices=["laquant", "compressed-tensors"], default="laquant",
                   help="laquant: laquant's checkpoint (laquant.load, with the statistics); compressed-tensors: "
                        "the W8A8 int8 checkpoint vLLM serves and transformers loads without laquant, with "
                        "serving.md (transformers hybrids only; `laquant export` converts a laquant checkpoint later)")
    add_export_arguments(p, with_eval=False)
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    p.add_argument("--max-shard-size", default=None, metavar="SIZE",
                   help="split the weights into shards of at most SIZE (e.g. 5GB, 500MB) with a "
                        "model.safetensors.index.json, as transformers' save_pretrained does (default: one file)")
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
                   help="calibrate one decoder layer at a time on --device. GLA / Gated DeltaNet: the layers "
                        "are read from the model's files when needed and quantized and written one at a time, "
                        "so neither memory holds the model (for models larger than memory); transformers "
                        "hybrids: the model waits in CPU memory. The perplexity comparison loads the whole "
                        "model: add --no-eval if it does not fit")
    p.add_argument("--quiet", action="store_true")


def first_checks(args: argparse.Namespace) -> tuple[dict, Path, Path]:
    """``(recipe, out, model_dir)``: what can be checked before the heavy imports."""
    if args.samples < 1 or args.seq_len < 2:
        raise LaquantError(f"--samples must be >= 1 and --seq-len >= 2 (got {args.samples}, {args.seq_len})")
    if not args.no_eval and (args.eval_context < 2 or args.eval_max_tokens < 2):
        raise LaquantError(f"--eval-context and --eval-max-tokens must be >= 2 "
                           f"(got {args.eval_context}, {args.eval_max_tokens})")
    recipe = load_recipe(args.recipe, args.set)
    out = Path(args.out or f"laquant-{recipe['name']}")
    check_out_dir(out, args.overwrite)
    model_dir = check_model_dir(args.model)
    if args.format == "compressed-tensors":
        check_exportable(read_config(model_dir).get("model_type"), model_dir)
    if args.max_shard_size is not None:
        from laquant.checkpoint import parse_size

        parse_size(args.max_shard_size)
    if args.stats is not None and not Path(args.stats).is_file():
        raise LaquantError(f"statistics file not found: {args.stats}")
    return recipe, out, model_dir


def run(args: argparse.Namespace) -> int:
    recipe, out, model_dir = first_checks(args)
    from laquant.cli import calibrate_steps

    return calibrate_steps.run(args, recipe, out, model_dir)
