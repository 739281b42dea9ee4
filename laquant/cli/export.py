"""``laquant export CKPT --format compressed-tensors --out OUT``: a laquant checkpoint of a transformers
hybrid rewritten as a compressed-tensors W8A8 int8 checkpoint (what vLLM serves and transformers loads
without laquant), with ``serving.md`` and the perplexity of the exported form next to laquant's."""

from __future__ import annotations

import argparse
from pathlib import Path

from laquant.errors import LaquantError
from laquant.export_options import OUTLIER_POLICIES, check_exportable
from laquant.paths import check_out_dir, read_config, resolve_model_dir

FORMATS = ("compressed-tensors",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a laquant checkpoint folder (written by `laquant calibrate`)")
    p.add_argument("--format", required=True, choices=FORMATS, help="the checkpoint format to write")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    add_export_arguments(p)
    p.add_argument("--baseline", default=None,
                   help="the unquantized model (folder or id), to put its perplexity in serving.md too")
    p.add_argument("--quiet", action="store_true")


def add_export_arguments(p: argparse.ArgumentParser, with_eval: bool = True) -> None:
    """Options shared with ``laquant calibrate --format compressed-tensors``."""
    p.add_argument("--outliers", choices=OUTLIER_POLICIES, default="requantize",
                   help="projections with bf16 outlier columns: requantize the full weight per channel (default, "
                        "they stay int8) or keep them dense bf16 (listed in `ignore`)")
    if with_eval:
        p.add_argument("--eval-data", default="wikitext2")
        p.add_argument("--eval-context", type=int, default=512)
        p.add_argument("--eval-max-tokens", type=int, default=4096,
                       help="perplexity of laquant's and the exported form on the first N tokens (CPU: keep it small)")
        p.add_argument("--no-eval", action="store_true", help="write serving.md without perplexities")


def run(args: argparse.Namespace) -> int:
    source = resolve_model_dir(args.checkpoint)
    out = Path(args.out)
    if out.resolve() == source.resolve():
        raise LaquantError(f"--out {out} is the checkpoint itself; choose another folder")
    check_out_dir(out, args.overwrite)
    from laquant.api import load
    from laquant.checkpoint import StagingDir, read_quantization_config
    from laquant.compressed_tensors_export import write_compressed_tensors
    from laquant.loading import load_model

    qcfg = read_quantization_config(source)
    if qcfg is None:
        raise LaquantError(f"{source} is not a laquant checkpoint (its config.json has no quantization_config); "
                           f"quantize it first: laquant calibrate --recipe hybrid_int8 --model {source} "
                           "--format compressed-tensors --out OUT")
    check_exportable(read_config(source).get("model_type"), source)
    baseline = resolve_model_dir(args.baseline) if args.baseline else None
    model, tokenizer = load(source)
    eval_ids = None if args.no_eval else eval_tokens(args, tokenizer)
    rows = []
    if eval_ids is not None:
        if baseline is not None:
            base_model, _ = load_model(baseline)
            rows.append(("bf16", ppl_row(base_model, eval_ids, args)))
            del base_model
        rows.append((f"laquant ({qcfg['recipe'].get('name', '?')})", ppl_row(model, eval_ids, args)))
    with StagingDir(out, args.overwrite) as tmp:
        summary = write_compressed_tensors(model, qcfg["decisions"], tmp, tokenizer, args.outliers)
        write_serving(tmp, summary, str(source), qcfg["recipe"].get("name", "?"), rows, eval_ids, args)
    report(summary, out, args.quiet)
    return 0


def eval_tokens(args: argparse.Namespace, tokenizer):
    from laquant.data import load_text, tokenize
    from laquant.eval.ppl import default_stride, strided_windows

    ids = tokenize(load_text(args.eval_data), tokenizer)[: args.eval_max_tokens]
    strided_windows(len(ids), args.eval_context, default_stride(args.eval_context))  # checks the sizes first
    return ids


def ppl_row(model, ids, args: argparse.Namespace) -> dict:
    """Prefill-mode perplexity (the mode transformers' own model runs) and model bytes."""
    import torch

    from laquant.eval.ppl import perplexity
    from laquant.eval.report import model_bytes

    with torch.no_grad():
        res = perplexity(model.eval(), ids, context=args.eval_context, mode="prefill", progress=not args.quiet)
    return {"prefill": res.ppl, "model_bytes": model_bytes(model)}


def exported_row(folder: Path, ids, args: argparse.Namespace, model_type: str) -> dict:
    """The exported folder loaded as a user without laquant would (transformers + compressed-tensors, through the
    family's Auto class: ``AutoModelForImageTextToText`` for the vision-language models), float32 compute on the CPU
    like laquant's row."""
    import torch
    from transformers.utils import logging as hf_logging

    from laquant.families import get_family

    hf_logging.disable_progress_bar()
    try:
        model = get_family(model_type).model_class().from_pretrained(folder, dtype=torch.float32)
    except ImportError as exc:
        raise LaquantError(f"loading the exported form needs compressed-tensors ({exc}); "
                           "pip install 'compressed-tensors>=0.20', or pass --no-eval") from None
    finally:
        hf_logging.enable_progress_bar()
    row = ppl_row(model, ids, args)
    row["model_bytes"] = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return row


def write_serving(folder: Path, summary, source: str, recipe_name: str, rows: list, eval_ids,
                  args: argparse.Namespace) -> dict | None:
    """``serving.md`` in the export folder (``summary``: the export's ``Exported``); with ``eval_ids``,
    the exported form's perplexity below the rows already measured (returned)."""
    from laquant.compressed_tensors_export import serving_markdown
    from laquant.eval.ppl import default_stride

    table, note, exported = None, "", None
    if eval_ids is not None:
        exported = exported_row(folder, eval_ids, args, summary.model_type)
        table = ppl_table(rows + [("compressed-tensors export", exported)])
        note = (f"Prefill mode on `{args.eval_data}`, first {len(eval_ids)} tokens, context {args.eval_context}, "
                f"stride {default_stride(args.eval_context)}, float32 compute (the export on the CPU). laquant's form runs its own "
                "quantized modules (outlier split, gate treatment); the export runs on transformers' own modules "
                "through compressed-tensors, as a user without laquant loads it, its recurrent state in float32. "
                "Percentages are against the first row. Model MiB: the weights as stored.")
    (folder / "serving.md").write_text(serving_markdown(summary, source, recipe_name, table, note))
    return exported


def ppl_table(rows: list[tuple[str, dict]]) -> str:
    base = rows[0][1]["prefill"]
    lines = ["| model | ppl prefill | model MiB |", "|---|---|---|"]
    for i, (name, r) in enumerate(rows):
        delta = "" if i == 0 else f" ({100 * (r['prefill'] / base - 1):+.2f}%)"
        lines.append(f"| {name} | {r['prefill']:.3f}{delta} | {r['model_bytes'] / 2**20:.2f} |")
    return "\n".join(lines)


def report(summary, out: Path, quiet: bool) -> None:
    if quiet:
        return
    print(f"wrote {out}/ (model.safetensors, config.json, serving.md): {len(summary.int8)} projections W8A8 int8 "
          f"({len(summary.requantized)} with outlier columns requantized), {len(summary.dense)} written dense, "
          f"{len(summary.ignore)} modules in `ignore`; serve with --mamba-ssm-cache-dtype {summary.engine_state_dtype}")
