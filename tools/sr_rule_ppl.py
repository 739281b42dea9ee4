"""Decode-mode perplexity of the shipped gla-small quantized with gla_int8 (int8 state, stochastic
rounding), with the stochastic int rounding's rule of 2026-11-27 (``round(256 * frac) + r >= 256``,
on float32's bits) and with the rule before it (``256 * frac >= 255.5 - r``): the two differ only
where ``256 * frac`` is exactly a half-integer, and round up with the same probability. Nearest
rounding and the float32 state give the scale of the differences. CPU (the references, which the
kernels equal bit for bit).

    python tools/sr_rule_ppl.py OUT.json [--context 512] [--windows 16]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def rule_before(y: torch.Tensor, random: torch.Tensor) -> torch.Tensor:
    """The rule laquant rounded by until 2026-11-27 (numerics.round_stochastic_int then)."""
    units = y.abs()
    low = units.floor()
    mag = low + ((units - low) * 256.0 >= 255.5 - random.float()).float()
    return torch.where(y < 0, -mag, mag)


def main(argv=None) -> int:
    import laquant
    from laquant.api import load
    from laquant.eval.ppl import perplexity
    from laquant.kernels.common import numerics
    from laquant.recipe import load_recipe

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--windows", type=int, default=16)
    args = p.parse_args(argv)
    assets = Path(laquant.__file__).parent / "assets"
    rule_now = numerics.round_stochastic_int
    result = {"model": "gla-small (shipped)", "recipe": "gla_int8", "context": args.context, "torch": torch.__version__}
    for name, recipe_set, rule in (("float32 state", ["state.format=fp32", "state.rounding=nearest"], rule_now),
                                   ("int8 nearest", ["state.rounding=nearest"], rule_now),
                                   ("int8 stochastic, rule before", [], rule_before),
                                   ("int8 stochastic, rule now", [], rule_now)):
        model, tok = load(assets / "gla-small")
        calib = tok((assets / "data/calibration/wiki.utf8").read_text()[:200_000], return_tensors="pt").input_ids[0]
        recipe = load_recipe("gla_int8", overrides=recipe_set)
        laquant.calibrate(model, recipe, calib, samples=16, seq_len=512, progress=False)
        ids = tok((assets / "data/wikitext-2-raw/wiki.test.raw").read_text(), return_tensors="pt").input_ids[0]
        ids = ids[: args.context * args.windows]
        numerics.round_stochastic_int = rule
        try:
            start = time.perf_counter()
            r = perplexity(model, ids, context=args.context, mode="decode", progress=False)
        finally:
            numerics.round_stochastic_int = rule_now
        result[name] = r.ppl
        print(f"{name}: decode ppl {r.ppl:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    result["tokens"] = int(ids.numel())
    before, now = result["int8 stochastic, rule before"], result["int8 stochastic, rule now"]
    result["rule_change_pct"] = 100 * (now / before - 1)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
