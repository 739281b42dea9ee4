"""Wall clock of the eager paths the host bounds (issue #14): a random 16-head 1.37B GLA (bf16 and gla_int8_all), one
eager decode step at B = 1 and 64 after a 512-token prompt, and an eager prefill of 1,024 and 4,096 tokens; synced
wall medians of 10 and the GPU time of the same call (torch.profiler). Run once per checkout, alternated, for A/B.

    python3 tools/eager_wall.py OUT.json        # VARIANTS="bf16 gla_int8_all" by default
"""
import json
import os
import sys

import torch
from profile_host import gpu_ms
from profile_prefill import random_gla, wall_ms

from laquant.generate import DecodeSession
from laquant.models import GLAConfig


@torch.no_grad()
def main(out: str) -> None:
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=24, num_heads=16, vocab_size=32000)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "fast_launch": os.environ.get("LAQUANT_FAST_LAUNCH", "1")}
    for variant in os.environ.get("VARIANTS", "bf16 gla_int8_all").split():
        model = random_gla(cfg, variant)
        rows = {}
        for B in (1, 64):
            session = DecodeSession(model, torch.randint(0, 32000, (B, 512), device="cuda"), 200, graphed=False)
            for _ in range(3):
                session.step()
            rows[f"decode_B{B}"] = {"wall_ms": wall_ms(session.step, reps=10), "gpu_ms": gpu_ms(session.step)[0]}
        for T in (1024, 4096):
            ids = torch.randint(0, 32000, (1, T), device="cuda")
            fn = lambda: model(ids, use_cache=True, logits_to_keep=1)  # noqa: E731, B023
            for _ in range(2):
                fn()
            rows[f"prefill_{T}"] = {"wall_ms": wall_ms(fn, reps=10), "gpu_ms": gpu_ms(fn)[0]}
        print(variant, {k: {m: round(v, 2) for m, v in r.items()} for k, r in rows.items()}, flush=True)
        result[variant] = rows
        del model
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
