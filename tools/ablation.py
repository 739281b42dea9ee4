"""Recipe ablation: bf16 vs each recipe, perplexity in prefill and decode mode, one table.

    python tools/ablation.py [MODEL] --out eval/results/ablation_gla-small [--max-tokens N] [--device cuda]

Statistics are collected once and reused by every recipe, so the recipes differ only in what they
do with them. Writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import laquant
import laquant.adapters
from laquant.api import calibrate
from laquant.calibration.run import calibration_batches, collect_stats
from laquant.data import load_text, tokenize
from laquant.eval.ppl import perplexity_by_mode
from laquant.eval.report import model_bytes, state_bytes_per_sequence
from laquant.loading import resolve_model_dir
from laquant.recipe import load_recipe

DEFAULT_RECIPES = ["gla_int8", "gla_w8a8", "gla_w8a8_naive", "gla_gates_int8", "gla_gates_naive",
                   "gla_fp8_state", "gla_fp8_state_naive", "gla_bf16_state"]
# hybrids: the whole recipe, then each part alone (the gla_* part recipes speak in roles, so they
# apply to any family: projections of the linear layers and MLPs, gates, state), then naive forms
HYBRID_RECIPES = ["hybrid_int8", "hybrid_int8_fp8", "gla_w8a8", "hybrid_attention_w8a8", "gla_w8a8_naive", "gla_gates_int8",
                  "gla_gates_naive", "gla_fp8_state", "gla_fp8_state_naive", "gla_bf16_state"]


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """The model, output, evaluation text and calibration arguments (this tool's and tools/group_codes_ppl.py's)."""
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--out", required=True, help="output path without extension (.json and .md are written)")
    p.add_argument("--data", default="wikitext2")
    p.add_argument("--calib-data", default="calibration")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)


def load_inputs(args: argparse.Namespace, device: str) -> tuple:
    """``(model_dir, model, evaluation ids, calibration batches)`` as :func:`add_data_arguments` names them."""
    model_dir = resolve_model_dir(args.model)
    model, tok = laquant.load_model(model_dir, device=device)
    ids = tokenize(load_text(args.data), tok)[: args.max_tokens]
    calib = calibration_batches(tokenize(load_text(args.calib_data), tok), args.samples, args.seq_len, args.seed)
    return model_dir, model, ids, calib


def perplexities(model, ids, context: int, modes=("prefill", "decode"), batch_size=None, progress=False) -> dict:
    """``{mode: ppl, f"{mode}_nll": nll}`` for each mode."""
    results = perplexity_by_mode(model, ids, context, list(modes), batch_size, progress)
    return {k: v for mode, r in results.items() for k, v in ((mode, r.ppl), (f"{mode}_nll", r.nll))}


def write_result(result: dict, out: str, markdown) -> None:
    """``OUT.json`` and ``OUT.md`` (``markdown(result)``), the markdown printed too."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def run(args: argparse.Namespace) -> dict:
    model_dir, model, ids, calib = load_inputs(args, args.device)
    adapter = laquant.adapters.get_adapter(model)
    mixers = {n: vars(i) for n, i in adapter.mixers().items()}
    recipes = args.recipes or (DEFAULT_RECIPES if model.config.model_type == "gla" else HYBRID_RECIPES)

    def evaluate(m) -> dict:
        return perplexities(m, ids, args.context, args.mode, args.batch_size, not args.quiet)

    t0 = time.time()
    rows = [{"name": "bf16", **evaluate(model), "model_bytes": model_bytes(model),
             "state_bytes": state_bytes_per_sequence(mixers, None)}]
    print(json.dumps(rows[-1]), flush=True)
    stats = collect_stats(model, adapter, calib.to(args.device), seed=args.seed, progress=not args.quiet)
    for name in recipes:
        m, _ = laquant.load_model(model_dir, device=args.device)
        recipe_name, *overrides = name.split(",")
        res = calibrate(m, load_recipe(recipe_name, overrides), stats=stats)
        n_outliers = sum(len(d["outliers"]) for d in res.decisions["projections"].values())
        rows.append({"name": name, **evaluate(m), "model_bytes": model_bytes(m),
                     "state_bytes": state_bytes_per_sequence(mixers, res.decisions), "outlier_channels": n_outliers})
        print(json.dumps(rows[-1]), flush=True)
        del m
    versions = {"laquant": laquant.__version__, "torch": torch.__version__}
    if args.device.startswith("cuda"):
        versions["gpu"] = torch.cuda.get_device_name()
    return {"model": str(model_dir), "data": args.data, "tokens": len(ids), "context": args.context,
            "stride": args.context // 2, "calibration": {"data": args.calib_data, "samples": args.samples,
                                                         "seq_len": args.seq_len, "seed": args.seed},
            "device": args.device, "dtype": "float32", "versions": versions, "seconds": time.time() - t0,
            "rows": rows}


def markdown(result: dict) -> str:
    modes = [m for m in ("prefill", "decode") if m in result["rows"][0]]
    base = result["rows"][0]
    lines = [f"Model `{Path(result['model']).name}`, {result['data']} ({result['tokens']} tokens), context "
             f"{result['context']}, stride {result['stride']}, {result['device']}, float32 compute; calibration "
             f"{result['calibration']['samples']} x {result['calibration']['seq_len']} tokens of "
             f"`{result['calibration']['data']}`.", "",
             "| recipe | " + " | ".join(f"ppl {m}" for m in modes) + " | model MiB | state KiB / seq | outlier ch. |",
             "|---|" + "---|" * (len(modes) + 3)]
    for r in result["rows"]:
        cells = [f"{r[m]:.3f}" if r is base else f"{r[m]:.3f} ({100 * (r[m] / base[m] - 1):+.2f}%)" for m in modes]
        lines.append(f"| {r['name']} | " + " | ".join(cells) +
                     f" | {r['model_bytes'] / 2**20:.2f} | {r['state_bytes'] / 1024:.1f} | {r.get('outlier_channels', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python tools/ablation.py", description=__doc__.splitlines()[0])
    add_data_arguments(p)
    p.add_argument("--recipes", nargs="+", default=None,
                   help="recipe names, each optionally with overrides: gla_fp8_state,state.format=int8_row "
                        "(default: the ablation set of the model's family)")
    p.add_argument("--mode", nargs="+", default=["prefill", "decode"])
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    write_result(run(args), args.out, markdown)


if __name__ == "__main__":
    main()
