"""Perplexity of a trained hybrid quantized with hybrid_int8, with its norms and SwiGLUs writing the W8A8
codes (laquant.models.quantizing_rowwise, the default) and without (transformers' modules, each
projection quantizing its own input): the accuracy side of that fusion (issue #14). GPU only.

    python tools/norm_codes_ppl.py MODEL_DIR OUT.json [--context 512] [--windows 32]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main(argv=None) -> int:
    import laquant
    from laquant.api import load
    from laquant.eval.ppl import perplexity
    from laquant.models import quantizing_rowwise

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--windows", type=int, default=32)
    args = p.parse_args(argv)
    model, tok = load(args.model, device="cuda", dtype=torch.bfloat16)
    assets = Path(laquant.__file__).parent / "assets/data"
    calib = tok((assets / "calibration/wiki.utf8").read_text()[:200_000], return_tensors="pt").input_ids[0]
    laquant.calibrate(model, "hybrid_int8", calib.cuda(), samples=16, seq_len=512, progress=False)
    ids = tok((assets / "wikitext-2-raw/wiki.test.raw").read_text(), return_tensors="pt").input_ids[0]
    ids = ids[: args.context * args.windows]
    fused_modules = [m for m in model.modules()
                     if isinstance(m, (quantizing_rowwise._QuantizingNorm, quantizing_rowwise._QuantizingSwiGLU,
                                       quantizing_rowwise._GroupedInputs))]
    result = {"model": args.model, "modules_writing_codes": len(fused_modules), "context": args.context,
              "tokens": int(ids.numel()), "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for fused in (True, False):
        if not fused:
            for module in fused_modules:
                module.__class__ = module._laquant_base
            quantizing_rowwise.GATED_NORMS.clear()
        for mode in ("prefill", "decode"):
            r = perplexity(model, ids, context=args.context, mode=mode, progress=False)
            result[f"{'fused' if fused else 'unfused'}_{mode}_ppl"] = r.ppl
            print(fused, mode, r.ppl, flush=True)
    for mode in ("prefill", "decode"):
        result[f"{mode}_change_pct"] = 100 * (result[f"fused_{mode}_ppl"] / result[f"unfused_{mode}_ppl"] - 1)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
