"""The accuracy side of static activation scales on the projections that close a block (issue #14,
``eval/results/step_ablation_h200/``): a trained model calibrated once with a W8A8 recipe, its perplexity with today's
per-token activation scales, and with one calibrated scale per projection on the inputs of o_proj and down_proj
(``laquant.families.OUTPUT_PROJECTIONS``), or of every W8A8 projection.

Why: the kernels that write those inputs' codes see part of a row (the GLA decode kernel a head, SwiGLU a group). A
per-token scale makes them wait for the row's absmax (an arrival counter), and per-group scales make the GEMM slower.
A static scale needs neither: the code is ``clamp(round(x / s), -127, 127)`` with ``s`` fixed at calibration, the
largest calibrated absmax of the projection's non-outlier input columns / 127 (values beyond clip), and the GEMM is
today's per-token one with one scale. This tool measures what that costs in perplexity before any kernel is built.

The static run swaps the W8A8 reference (the CPU path's) for its static form on the modules named: the codes times
``s``, multiplied with the dequantized int8 weight in float32, the outlier columns' product in float as today. Same
calibration, weights and state. CPU, float32 compute, as ``tools/ablation.py``.

    python tools/static_codes_ppl.py --out eval/results/static_codes_ppl_cpu [--max-tokens 16384]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from laquant.families import OUTPUT_PROJECTIONS
from laquant.kernels.common.numerics import dequantize
from laquant.quant.modules import QuantLinear

sys.path.insert(0, str(Path(__file__).parent))
from ablation import add_data_arguments, write_result  # noqa: E402
from group_codes_ppl import calibrated_baseline, markdown  # noqa: E402  (the same baseline and table)


def static_scale(module: QuantLinear, bound: torch.Tensor) -> torch.Tensor:
    """One activation scale for ``module``: the largest calibrated ``bound`` (per input column: the absmax, or the
    99.9th percentile of |x|) of its non-outlier input columns / 127."""
    kept = bound.float().index_select(0, module.keep_idx.to(bound.device))
    return (kept.max().clamp_min(1e-8) / 127).reshape(())


def static_forward(module: QuantLinear, scale: torch.Tensor):
    """``module``'s W8A8 product with the static activation ``scale`` (its weights and outlier columns as today)."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        codes = torch.clamp(torch.round(x2.index_select(1, module.keep_idx) / scale), -127, 127)
        y = (codes * scale) @ dequantize(module.qweight[:, :module.n_main], module.weight_scale).T
        if module.n_outliers:
            y = y + x2.index_select(1, module.outlier_idx) @ module.outlier_weight.float().T
        if module.bias is not None:
            y = y + module.bias.float()
        return y.to(x.dtype).reshape(*shape[:-1], -1)

    return forward


def static_modules(model, stats, outputs_only: bool) -> dict[str, QuantLinear]:
    """The per-token W8A8 projections whose inputs get a static scale."""
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear) and m.act_granularity == "per_token"
            and (not outputs_only or n.rpartition(".")[2] in OUTPUT_PROJECTIONS) and f"{n}/act_absmax" in stats.tensors}


def run(args: argparse.Namespace) -> dict:
    t0 = time.time()
    model_dir, model, ids, stats, evaluate, rows = calibrated_baseline(args)
    for outputs_only, what in ((True, "o_proj and down_proj"), (False, "every W8A8 projection")):
        for bound in ("act_absmax", "act_p999"):
            modules = static_modules(model, stats, outputs_only)
            for name, m in modules.items():
                m.forward = static_forward(m, static_scale(m, stats.get(name, bound)))
            try:
                rows.append({"name": f"{args.recipe}, static activation scales ({bound}) on {what} ({len(modules)} "
                                     "modules)", **evaluate(model)})
            finally:
                for m in modules.values():
                    del m.forward
            print(json.dumps(rows[-1]), flush=True)
    return {"model": str(model_dir), "recipe": args.recipe, "data": args.data, "tokens": len(ids),
            "context": args.context, "calibration": {"samples": args.samples, "seq_len": args.seq_len,
                                                     "seed": args.seed},
            "device": "cpu", "dtype": "float32", "torch": torch.__version__, "seconds": round(time.time() - t0),
            "rows": rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python tools/static_codes_ppl.py", description=__doc__.splitlines()[0])
    add_data_arguments(p)
    p.set_defaults(max_tokens=16384)
    p.add_argument("--recipe", default="gla_int8_all")
    args = p.parse_args(argv)
    write_result(run(args), args.out, markdown)


if __name__ == "__main__":
    main()
