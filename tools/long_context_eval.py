"""Long-context decode-mode accuracy of the 8-bit recurrent states (issue #16).

For one model (default: the embedded gla-small), one bf16 reference (float32 state) and each
variant ``RECIPE`` or ``RECIPE:FORMAT:ROUNDING`` (the recipe with its state format and rounding
overridden; default: the state-only recipe ``gla_fp8_state`` with fp8_row and int8_row, each
rounded to nearest and stochastically), on WikiText-2 and the Gutenberg
held-out text, at each context: decode-mode perplexity (token by token, one CUDA-graph replay per
token on CUDA), the loss at every position of the window averaged over windows, and its drift
(variant minus bf16). Writes under ``--out``:

* ``results.json``: per data and context, each variant's ppl, nll, tokens, seconds, the change
  against bf16, the loss and drift by position in 64 log-spaced bins, and the saturation counts
  (state elements at their format's limit, non-finite state elements, gate logits clamped: totals
  and by position; counted on the device inside the graphed step);
* ``loss_by_position.npz``: the full per-position curves (``DATA/CONTEXT/VARIANT``);
* ``saturation.json``: the saturation counts by position, unbinned;
* ``summary.md``: the tables; ``plots/{loss,drift,saturation}_DATA_CONTEXT.png``.

MODEL may be any model laquant takes (a transformers hybrid too: its variants are
``hybrid_int8:FORMAT:ROUNDING``; on CUDA the hybrids decode on the graphed loop too, on the CPU a Python
step per token).

    python tools/long_context_eval.py --out eval/results/long_context              # 2K and 16K
    python tools/long_context_eval.py --out /tmp/lc --contexts 2048 --max-windows 8  # a quick check
    python tools/long_context_eval.py --out ... --long                              # adds 64K

A slow run (a hybrid on the CPU, several recipes at 64K) can be split across processes, one part per variant or text,
the reference in one of them, then merged into one summary:

    python tools/long_context_eval.py --out P1 --data wikitext2 --variants   # the bf16 reference alone
    python tools/long_context_eval.py --out P2 --data wikitext2 --variants hybrid_int8 --no-reference
    python tools/long_context_eval.py --out ALL --merge P1 P2
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

import laquant
from laquant.data import load_text, tokenize
from laquant.eval.plots import plot_drift, plot_loss_by_position, plot_saturation_by_position
from laquant.eval.ppl import default_stride, perplexity
from laquant.loading import load_tokenizer, resolve_model_dir
from laquant.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
DATA = {"wikitext2": "wikitext2", "gutenberg": str(REPO / "eval" / "data" / "gutenberg-heldout" / "gutenberg_heldout.txt")}
DEFAULT_VARIANTS = [f"gla_fp8_state:{fmt}:{rounding}" for fmt in ("fp8_row", "int8_row")
                    for rounding in ("nearest", "stochastic")]
BINS = 64


def binned(values: np.ndarray) -> dict:
    """Mean of ``values[1:]`` in log-spaced position bins (positions 1..len-1)."""
    n = len(values)
    edges = np.unique(np.geomspace(1, n, BINS + 1).astype(int))
    return {"start": edges[:-1].tolist(), "mean": [float(values[a:b].mean()) for a, b in zip(edges[:-1], edges[1:])]}


def load_variant(model_dir: Path, variant: str, calib: torch.Tensor, device: str, dtype: torch.dtype):
    model, _ = laquant.load(model_dir, device=device, dtype=dtype)
    if variant == "bf16":
        return model
    recipe, *state = variant.split(":")
    overrides = [f"state.format={state[0]}", f"state.rounding={state[1]}"] if state else []
    laquant.calibrate(model, load_recipe(recipe, overrides), calib, samples=16, seq_len=512, progress=False)
    return model


def run_variants(args, contexts: list[int]) -> tuple[dict, dict, dict]:
    """Decode every variant on every text and context: (results, curves, raw saturation)."""
    model_dir = resolve_model_dir(args.model)
    tokenizer = load_tokenizer(model_dir)
    texts = {name: tokenize(load_text(DATA[name]), tokenizer) for name in args.data}
    calib = tokenize(load_text("calibration"), tokenizer)  # the shipped calibration mix, never the eval text
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device == "cuda" else torch.float32)
    variants = ([] if args.no_reference else ["bf16"]) + args.variants
    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    results: dict = {"model": str(model_dir), "device": device, "dtype": str(dtype).removeprefix("torch."),
                     "torch": torch.__version__, "variants": variants, "runs": {}}
    curves: dict[str, np.ndarray] = {}
    saturation: dict[str, dict] = {}
    for variant in variants:
        model = load_variant(model_dir, variant, calib, args.device, dtype)
        for name, ids in texts.items():
            for ctx in contexts:
                stride = default_stride(ctx)
                if len(ids) < ctx:
                    print(f"skip {name} ctx={ctx}: only {len(ids)} tokens", flush=True)
                    continue
                use = ids if args.max_windows is None else ids[: ctx + (args.max_windows - 1) * stride]
                t0 = time.perf_counter()
                res = perplexity(model, use, context=ctx, mode="decode", batch_size=args.batch_size, progress=True)
                curve = np.array(res.loss_by_position_all)
                curves[f"{name}/{ctx}/{variant}"] = curve
                run = results["runs"].setdefault(f"{name}/{ctx}", {"tokens": len(use), "stride": stride})
                sat = {k: v for k, v in res.saturation.items() if not k.endswith("by_position")}
                for k in ("state_at_limit_fraction_by_position", "gate_clamped_fraction_by_position"):
                    sat[k] = binned(np.array(res.saturation[k]))
                sat["state_nonfinite_by_position"] = binned(np.array(res.saturation["state_nonfinite_by_position"],
                                                                     dtype=np.float64))
                saturation[f"{name}/{ctx}/{variant}"] = res.saturation
                run[variant] = {"ppl": res.ppl, "nll": res.nll, "tokens_scored": res.tokens_scored,
                                "seconds": time.perf_counter() - t0, "graphed": res.graphed,
                                "finite": bool(np.isfinite(curve).all()), "loss_by_position": binned(curve),
                                "saturation": sat}
                print(f"{variant:<36} {name:<10} ctx={ctx:<6} ppl {res.ppl:9.3f}  {res.seconds:7.1f}s "
                      f"graphed={res.graphed}", flush=True)
        del model
        torch.cuda.empty_cache() if args.device == "cuda" else None
    return results, curves, saturation


def save_raw(out: Path, results: dict, curves: dict, saturation: dict) -> None:
    # results.json before the summary and plots too: a failed plot must not lose hours of decoding
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    np.savez_compressed(out / "loss_by_position.npz", **{k: v.astype(np.float32) for k, v in curves.items()})
    (out / "saturation.json").write_text(json.dumps(saturation) + "\n")


def merge_raw(folders: list[Path]) -> tuple[dict, dict, dict]:
    """One run's (results, curves, saturation) from the raw files of runs split across processes
    (each ran some variants on some texts, one of them the bf16 reference)."""
    results: dict = {}
    curves: dict[str, np.ndarray] = {}
    saturation: dict[str, dict] = {}
    for folder in folders:
        part = json.loads((folder / "results.json").read_text())
        if not results:
            results = {**part, "variants": [], "runs": {}}
        elif (part["model"], part["device"], part.get("dtype")) != (results["model"], results["device"],
                                                                     results.get("dtype")):
            raise SystemExit(f"{folder}: another model, device or dtype than {folders[0]}; merge one run's parts")
        results["variants"] += [v for v in part["variants"] if v not in results["variants"]]
        for key, run in part["runs"].items():
            results["runs"].setdefault(key, {}).update(run)
        with np.load(folder / "loss_by_position.npz") as npz:
            curves.update({k: npz[k].astype(np.float64) for k in npz.files})
        saturation.update(json.loads((folder / "saturation.json").read_text()))
    results["variants"].sort(key=lambda v: v != "bf16")  # the reference first
    return results, curves, saturation


def write_summary(out: Path, results: dict, curves: dict, saturation: dict) -> list[str]:
    variants = results["variants"]
    lines = [f"# Long-context decode-mode perplexity ({results['device']})", "",
             f"Model `{Path(results['model']).name}`, {results.get('dtype', 'bfloat16')} compute; reference (`bf16`): "
             "the unquantized model, its state in float32. Drift: mean loss "
             "of the variant minus bf16's over the last 10% of window positions (nats). State at limit: the "
             "fraction of stored state elements at their format's largest code (with per-row dynamic scales "
             "each row's largest element sits there by construction: about 1/V is the floor, and only a "
             "fraction growing along the window would say the scales clip); gate clamped: int8 gate logits "
             "outside their calibrated range.", ""]
    for key, run in results["runs"].items():
        base = run.get("bf16")
        lines += [f"## {key} ({run['tokens']} tokens, stride {run['stride']})", "",
                  "| variant | ppl | vs bf16 | drift, last 10% (nats) | state at limit | non-finite state | "
                  "gate clamped | seconds |", "|---|---|---|---|---|---|---|---|"]
        base_curve = curves.get(f"{key}/bf16")
        pairs, series = {}, {}
        for variant in variants:
            if variant not in run:
                continue
            r = run[variant]
            curve = curves[f"{key}/{variant}"]
            series[variant] = curve.tolist()
            delta = drift = float("nan")
            if base is not None and variant != "bf16":
                delta = 100.0 * (r["ppl"] / base["ppl"] - 1.0)
                d = curve - base_curve
                drift = float(d[-max(1, len(d) // 10):].mean())
                r["ppl_change_pct"], r["drift_last10pct"] = delta, drift
                r["drift_by_position"] = binned(np.concatenate([[0.0], d[1:]]))
                pairs[variant] = (curve.tolist(), base_curve.tolist())
            sat = r["saturation"]
            lines.append(f"| {variant} | {r['ppl']:.3f} | {'' if math.isnan(delta) else f'{delta:+.2f}%'} | "
                         f"{'' if math.isnan(drift) else f'{drift:+.4f}'} | {100 * sat['state_at_limit_fraction']:.3f}% | "
                         f"{sat['state_nonfinite']} | {100 * sat['gate_clamped_fraction']:.4f}% | {r['seconds']:.1f} |")
        lines.append("")
        tag = key.replace("/", "_")
        plot_loss_by_position(series, out / "plots" / f"loss_{tag}.png", f"decode-mode loss by position, {key}")
        if pairs:
            plot_drift(pairs, out / "plots" / f"drift_{tag}.png", f"loss minus bf16's by position, {key}")
        plot_saturation_by_position({v: saturation[f"{key}/{v}"] for v in variants if v in run},
                                    out / "plots" / f"saturation_{tag}.png", f"saturation by position, {key}")
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--model", default=None, help="model directory (default: the embedded gla-small)")
    p.add_argument("--data", nargs="+", default=list(DATA), choices=list(DATA))
    p.add_argument("--contexts", nargs="+", type=int, default=[2048, 16384])
    p.add_argument("--long", action="store_true", help="also 65536-token windows")
    p.add_argument("--variants", nargs="*", default=DEFAULT_VARIANTS,
                   help="RECIPE (as it is) or RECIPE:STATE_FORMAT:ROUNDING (the bf16 reference runs first)")
    p.add_argument("--no-reference", action="store_true",
                   help="skip the bf16 reference (a part of a run split across processes: see --merge)")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="DIR",
                   help="write --out's summary and plots from the raw files of these parts (no decoding)")
    p.add_argument("--max-windows", type=int, default=None, help="at most this many windows per context")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="compute dtype (default: bfloat16 on CUDA, float32 on CPU)")
    args = p.parse_args()
    (args.out / "plots").mkdir(parents=True, exist_ok=True)
    if args.merge:
        results, curves, saturation = merge_raw(args.merge)
    else:
        contexts = args.contexts + ([65536] if args.long and 65536 not in args.contexts else [])
        results, curves, saturation = run_variants(args, contexts)
    save_raw(args.out, results, curves, saturation)
    print("\n".join(write_summary(args.out, results, curves, saturation)))


if __name__ == "__main__":
    main()
