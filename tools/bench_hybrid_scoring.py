"""lm-eval's scoring calls on a transformers hybrid with laquant's mixers, eager against replayed
(laquant.serving.graphed_forward), bf16 against hybrid_int8 (calibrated on random tokens), on one GPU in one process:
``model(ids)`` at four shapes and bench_graphed_forward's lm-eval-like stream (64 requests of 100-1,000 tokens).

    python3 tools/bench_hybrid_scoring.py --out DIR [--model 'qwen3_next:{}' ...]   # DIR/hybrid_scoring.json, .md
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from bench_graphed_forward import forward_rows, lm_eval_like  # noqa: E402

from laquant.eval.speed import recipe_variants  # noqa: E402

SHAPES = [(1, 128), (1, 512), (1, 2048), (4, 1024)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", nargs="+", default=["qwen3_next:{}"], help="laquant eval speed's FAMILY:{json} specs")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--replot", action="store_true", help="only write the markdown and PNG again from OUT's JSON")
    args = ap.parse_args()
    out = Path(args.out)
    if args.replot:
        write_report(json.loads((out / "hybrid_scoring.json").read_text()), out)
        return
    out.mkdir(parents=True, exist_ok=True)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, forward=[], lm_eval_like=[],
                  failures={})
    for label, variant, make in recipe_variants(args.model, "gla_int8_all"):
        from laquant.serving.graphed_forward import forward_graphs

        model = make()
        name = f"{label} {variant}"
        result["forward"] += forward_rows(model, name, args.reps, SHAPES)
        result["lm_eval_like"].append(lm_eval_like(model, name))
        result["failures"][name] = forward_graphs(model).failure
        del model
        torch.cuda.empty_cache()
    (out / "hybrid_scoring.json").write_text(json.dumps(result, indent=2) + "\n")
    write_report(result, out)


def write_report(result: dict, out: Path) -> None:
    """``hybrid_scoring.md`` (the tables) and ``hybrid_scoring.png`` (eager against replayed, per shape)."""
    lines = [f"{result['device']}, torch {result['torch']}", "",
             "| model variant | batch x tokens | eager ms | replayed ms | speedup | capture ms | max diff / largest |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['batch']} x {r['tokens']} | {r['eager_ms']} | {r['graphed_ms']} "
              f"| {r['speedup']}x | {r['capture_ms']} | {r['max_rel_diff']:.3g} |" for r in result["forward"]]
    lines += ["", "| model variant | lm-eval-like eager s | replayed s (first pass, captures in it) "
              "| speedup (first) |", "|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['eager_second_s']} | {r['graphed_second_s']} ({r['graphed_first_s']}) "
              f"| {r['speedup']}x ({r['speedup_with_captures']}x) |" for r in result["lm_eval_like"]]
    (out / "hybrid_scoring.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(result, out / "hybrid_scoring.png")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(dict.fromkeys(r["variant"] for r in result["forward"]))
    shapes = list(dict.fromkeys((r["batch"], r["tokens"]) for r in result["forward"]))
    by = {(r["variant"], r["batch"], r["tokens"]): r for r in result["forward"]}
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / (2 * len(variants))
    bars = [(v, mode) for v in variants for mode in ("eager", "graphed")]
    for i, (variant, mode) in enumerate(bars):
        ys = [by[(variant, b, t)][f"{mode}_ms"] for b, t in shapes]
        label = f"{variant.rsplit(' ', 1)[-1]} {'replayed' if mode == 'graphed' else mode}"
        ax.bar([x + (i - (len(bars) - 1) / 2) * width for x in range(len(shapes))], ys, width, label=label)
    ax.set_xticks(range(len(shapes)), [f"{b} x {t}" for b, t in shapes])
    ax.set_ylabel("ms a call (model(ids), no cache)")
    ax.set_title(f"{variants[0].rsplit(' ', 1)[0]}: eager vs replayed, {result['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
