"""laquant's graphed decode loop on a MoE hybrid, its decode steps' experts as grouped_mm, as batched_mm (a copy of
the chosen experts' weights per token and expert), and as laquant.moe_experts' rule picks (batched_mm up to
BATCHED_MM_MAX_BYTES gathered a layer), B = 1 ... 64; the prefill runs grouped_mm in all three. bf16, random weights,
FAMILY from tools/family_configs.py (default minimax), 1K prompt, 32 steps.

    FAMILY=minimax python3 tools/bench_experts_impl.py OUT.json     (GPU)
"""
import json
import os
import sys

import torch
from family_configs import CONFIGS

import laquant.moe_experts as moe
from laquant.eval.speed import _decode_rate, recipe_variants
from laquant.generate import release_graphs

LIMITS = {"grouped_mm": -1, "batched_mm": 1 << 62, "rule": moe.BATCHED_MM_MAX_BYTES}


def main():
    family = os.environ.get("FAMILY", "minimax")
    rows = []
    (label, variant, make), *_ = recipe_variants([f"{family}:{json.dumps(CONFIGS[family])}"], "gla_int8_all")
    model = make()
    for B in (1, 2, 4, 64):
        prompt = torch.randint(1, model.config.vocab_size, (B, 1024), device="cuda")
        for steps, limit in LIMITS.items():
            moe.BATCHED_MM_MAX_BYTES = limit
            release_graphs(model)
            rows.append(dict(model=label, variant=variant, B=B, decode_experts=steps,
                             gathered_MB=round(moe.gathered_bytes(model, B) / 2**20, 1),
                             tok_per_s=_decode_rate(model, prompt, 32, graphed=True)))
            print(json.dumps(rows[-1]), flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
