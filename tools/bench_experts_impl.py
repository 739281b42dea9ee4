"""laquant's graphed decode loop on a MoE hybrid with its experts as grouped_mm (transformers' default, what the loop
runs today) against batched_mm (a copy of the chosen experts' weights per token and expert), B = 1 ... 64: where the
64 MB rule that transformers' generate's graph steps follow (laquant/models/graphed_step.py) would pay in the loop
too. bf16, random weights, FAMILY from tools/family_configs.py (default minimax), 1K prompt, 32 steps.

    FAMILY=minimax python3 tools/bench_experts_impl.py OUT.json     (GPU)
"""
import json
import os
import sys

import torch
from family_configs import CONFIGS

from laquant.eval.speed import _decode_rate, recipe_variants
from laquant.generate import release_graphs


def main():
    family = os.environ.get("FAMILY", "minimax")
    rows = []
    (label, variant, make), *_ = recipe_variants([f"{family}:{json.dumps(CONFIGS[family])}"], "gla_int8_all")
    model = make()
    for B in (1, 4, 16, 64):
        prompt = torch.randint(1, model.config.vocab_size, (B, 1024), device="cuda")
        for impl in ("grouped_mm", "batched_mm"):
            model.set_experts_implementation(impl)
            release_graphs(model)
            rows.append(dict(model=label, variant=variant, B=B, experts=impl,
                             tok_per_s=_decode_rate(model, prompt, 32, graphed=True)))
            print(json.dumps(rows[-1]), flush=True)
    model.set_experts_implementation("grouped_mm")
    json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
