"""Decode-mode perplexity of the shipped gla-small quantized with gla_int8 (int8 state, stochastic rounding) under the
stochastic int rounding's rules laquant has shipped, each a different draw of the same rounding probabilities:

- until 2026-11-27: ``256 * frac >= 255.5 - r`` on ``|y|``, the sign restored, Philox-10 bytes;
- until 2026-12-04: ``round(256 * frac) + r >= 256`` on ``|y|``, the sign restored, Philox-10 bytes;
- now: ``floor(round(256 * y) / 256 + r / 256)`` (no sign test), Philox-7 bytes
  (``numerics.round_stochastic_int``, ``numerics.STATE_PHILOX_ROUNDS``).

Nearest rounding, the float32 state and the shipped rule under a second cache seed give the scale of the differences.
CPU (the references, which the kernels equal bit for bit).

    python tools/sr_rule_ppl.py OUT.json [--context 512] [--windows 8]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def rule_2026_11_27(y: torch.Tensor, random: torch.Tensor) -> torch.Tensor:
    units = y.abs()
    low = units.floor()
    mag = low + ((units - low) * 256.0 >= 255.5 - random.float()).float()
    return torch.where(y < 0, -mag, mag)


def rule_2026_12_04(y: torch.Tensor, random: torch.Tensor) -> torch.Tensor:
    m = (y.float().abs() + 32768.0).view(torch.int32) - 0x47000000
    mag = ((m + random.to(torch.int32)) >> 8).float()
    return torch.where(y < 0, -mag, mag)


def main(argv=None) -> int:
    import laquant
    from laquant.adapters import new_cache
    from laquant.api import load
    from laquant.eval import ppl
    from laquant.kernels.common import numerics, state
    from laquant.recipe import load_recipe

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--windows", type=int, default=8)
    args = p.parse_args(argv)
    assets = Path(laquant.__file__).parent / "assets"
    shipped = numerics.round_stochastic_int, state.STATE_PHILOX_ROUNDS
    result = {"model": "gla-small (shipped)", "recipe": "gla_int8", "context": args.context, "torch": torch.__version__}
    variants = (("float32 state", ["state.format=fp32", "state.rounding=nearest"], shipped, 0),
                ("int8 nearest", ["state.rounding=nearest"], shipped, 0),
                ("int8 stochastic, rule until 2026-11-27", [], (rule_2026_11_27, 10), 0),
                ("int8 stochastic, rule until 2026-12-04", [], (rule_2026_12_04, 10), 0),
                ("int8 stochastic, rule now", [], shipped, 0),
                ("int8 stochastic, rule now, cache seed 1", [], shipped, 1))
    _, tok = load(assets / "gla-small")
    calib = tok((assets / "data/calibration/wiki.utf8").read_text()[:200_000], return_tensors="pt").input_ids[0]
    ids = tok((assets / "data/wikitext-2-raw/wiki.test.raw").read_text(), return_tensors="pt").input_ids[0]
    ids = ids[: args.context * args.windows]
    models = {}  # one calibration a recipe: the rules differ only in the decode's stores, which leave the model as is
    for name, recipe_set, (rule, rounds), seed in variants:
        model = models.get(tuple(recipe_set))
        if model is None:
            model = models[tuple(recipe_set)] = load(assets / "gla-small")[0]
            laquant.calibrate(model, load_recipe("gla_int8", overrides=recipe_set), calib, samples=16, seq_len=512,
                              progress=False)
        numerics.round_stochastic_int, state.STATE_PHILOX_ROUNDS = rule, rounds
        ppl.new_cache = lambda m, seed=seed: new_cache(m, seed)
        try:
            start = time.perf_counter()
            r = ppl.perplexity(model, ids, context=args.context, mode="decode", progress=False)
        finally:
            numerics.round_stochastic_int, state.STATE_PHILOX_ROUNDS = shipped
            ppl.new_cache = new_cache
        result[name] = r.ppl
        print(f"{name}: decode ppl {r.ppl:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    result["tokens"] = int(ids.numel())
    now = result["int8 stochastic, rule now"]
    for name in ("int8 stochastic, rule until 2026-11-27", "int8 stochastic, rule until 2026-12-04",
                 "int8 stochastic, rule now, cache seed 1", "int8 nearest", "float32 state"):
        result[f"now_vs: {name} (%)"] = 100 * (now / result[name] - 1)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
