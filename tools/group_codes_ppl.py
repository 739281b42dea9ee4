"""The accuracy side of per-group activation codes (issue #14, ``eval/results/b64_step_budget.md``: the route where the
GEMMs' split-K fixups write the next projection's codes): a trained model calibrated once with a W8A8 recipe, its
perplexity with today's activation quantization (one scale per token) and with one scale per token and group of
``--group`` input columns, the outlier columns left out of the groups' absmax as they are left out of the token's.

The per-group run swaps the W8A8 reference (``int8_outlier_linear``, the CPU path's) for its per-group form: each
group's codes times its scale, multiplied with the dequantized int8 weight in float32. Same calibration, same weights,
same state; only the activations' scales differ. CPU (the reference path); float32 compute, as ``tools/ablation.py``.

    python tools/group_codes_ppl.py --out eval/results/group_codes_ppl_cpu [--max-tokens 8192] [--group 128]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import laquant.adapters
import laquant.quant.modules as quant_modules
from laquant.api import calibrate
from laquant.calibration.run import collect_stats
from laquant.kernels.common.numerics import dequantize, quantize_int8
from laquant.recipe import load_recipe

sys.path.insert(0, str(Path(__file__).parent))
from ablation import add_data_arguments, load_inputs, perplexities, write_result  # noqa: E402


def group_codes_linear(group: int):
    """``int8_outlier_linear`` with per-token, per-``group``-column activation scales (weights and outliers as
    today); the other activation granularities pass through unchanged."""
    per_token_linear = quant_modules.int8_outlier_linear

    def linear(x, qweight, weight_scale, keep_idx, outlier_idx, outlier_weight, bias=None, act_granularity="per_token"):
        if act_granularity != "per_token":
            return per_token_linear(x, qweight, weight_scale, keep_idx, outlier_idx, outlier_weight, bias,
                                    act_granularity)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        kept = x2.clone()
        if outlier_idx is not None and outlier_idx.numel():
            kept[:, outlier_idx] = 0.0  # out of the groups' absmax and codes; their product stays in float below
        width = kept.shape[1]
        padded = torch.nn.functional.pad(kept, (0, -width % group)).view(kept.shape[0], -1, group)
        codes, scale = quantize_int8(padded, dim=-1)
        x_deq = dequantize(codes, scale).view(kept.shape[0], -1)[:, :width]
        main = x_deq if keep_idx is None else x_deq.index_select(1, keep_idx)
        y = main @ dequantize(qweight, weight_scale).T
        if outlier_idx is not None and outlier_idx.numel():
            y = y + x2.index_select(1, outlier_idx) @ outlier_weight.float().T
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype).reshape(*shape[:-1], -1)

    return linear


def calibrated_baseline(args: argparse.Namespace):
    """``(model_dir, model, ids, stats, evaluate, rows)``: the model calibrated with ``args.recipe`` on the CPU (its
    statistics kept), ``evaluate(model)`` its perplexities on ``ids``, ``rows`` the float model's and the
    calibrated one's (printed as they come): what this tool and tools/static_codes_ppl.py compare against."""
    model_dir, model, ids, calib = load_inputs(args, "cpu")

    def evaluate(m) -> dict:
        return perplexities(m, ids, args.context)

    rows = [{"name": "float", **evaluate(model)}]
    print(json.dumps(rows[-1]), flush=True)
    stats = collect_stats(model, laquant.adapters.get_adapter(model), calib, seed=args.seed, progress=False)
    calibrate(model, load_recipe(args.recipe), stats=stats)
    rows.append({"name": f"{args.recipe}, per-token activation scales", **evaluate(model)})
    print(json.dumps(rows[-1]), flush=True)
    return model_dir, model, ids, stats, evaluate, rows


def run(args: argparse.Namespace) -> dict:
    t0 = time.time()
    model_dir, model, ids, _, evaluate, rows = calibrated_baseline(args)
    saved = quant_modules.int8_outlier_linear
    quant_modules.int8_outlier_linear = group_codes_linear(args.group)
    try:
        rows.append({"name": f"{args.recipe}, per-token x {args.group}-column activation scales", **evaluate(model)})
    finally:
        quant_modules.int8_outlier_linear = saved
    print(json.dumps(rows[-1]), flush=True)
    return {"model": str(model_dir), "recipe": args.recipe, "group": args.group, "data": args.data,
            "tokens": len(ids), "context": args.context, "calibration": {"samples": args.samples,
                                                                       "seq_len": args.seq_len, "seed": args.seed},
            "device": "cpu", "dtype": "float32", "torch": torch.__version__, "seconds": round(time.time() - t0),
            "rows": rows}


def markdown(result: dict) -> str:
    base = result["rows"][0]
    lines = [f"Model `{Path(result['model']).name}`, {result['data']} ({result['tokens']} tokens), context "
             f"{result['context']}, CPU reference path, float32 compute; calibration {result['calibration']['samples']}"
             f" x {result['calibration']['seq_len']} tokens.", "",
             "| activations | ppl prefill | ppl decode |", "|---|---|---|"]
    for r in result["rows"]:
        cells = [f"{r[m]:.3f}" if r is base else f"{r[m]:.3f} ({100 * (r[m] / base[m] - 1):+.3f}%)"
                 for m in ("prefill", "decode")]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python tools/group_codes_ppl.py", description=__doc__.splitlines()[0])
    add_data_arguments(p)
    p.set_defaults(max_tokens=8192)
    p.add_argument("--recipe", default="gla_int8_all")
    p.add_argument("--group", type=int, default=128)
    args = p.parse_args(argv)
    if args.group < 1:
        p.error(f"--group must be a positive number of columns, got {args.group}")
    write_result(run(args), args.out, markdown)


if __name__ == "__main__":
    main()
