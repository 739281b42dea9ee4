"""The hybrids' gated output norm inside the delta-rule / KDA decode kernel (issue #14): graphed decode tokens/s at
B = 64 of ~1B random hybrids (bf16 once; hybrid_int8 with the norm in the decode kernel and with its own kernel after
it, ``recurrent.FUSED_OUTPUT_NORM``, alternated twice in one process), 1,024-token prompt, 32 decode steps, as
``laquant eval speed``'s e2e decodes.

    python3 tools/output_norm_hybrid_probe.py OUT.json [FAMILY ...]
"""
import json
import sys

import torch

from eval.speed import _decode_rate, recipe_variants
from laquant.models import recurrent

SPECS = {
    "qwen3_next": {"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16,
                   "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                   "num_experts": 0},
    "qwen3_5_text": {"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "vocab_size": 32000},
}


def spec(family: str) -> str:
    if family in SPECS:
        return f"{family}:{json.dumps(SPECS[family])}"
    from family_configs import CONFIGS

    return f"{family}:{json.dumps(CONFIGS[family])}"


def rate(model, prompt) -> float:
    model.__dict__.pop("_laquant_decode_graphs", None)  # capture again under this setting
    return _decode_rate(model, prompt, 32, graphed=True)


def main(out: str, families) -> None:
    rows = []
    for family in families:
        for label, variant, make in recipe_variants([spec(family)], "gla_int8", "hybrid_int8"):
            model = make()
            prompt = torch.randint(0, model.config.vocab_size, (64, 1024), device="cuda")
            settings = [True] if variant == "bf16" else [True, False, True, False]
            for rep, fused in enumerate(settings):
                recurrent.FUSED_OUTPUT_NORM = fused
                rows.append(dict(family=family, variant=variant, fused_norm=fused, rep=rep, batch=64,
                                 tok_per_s=round(rate(model, prompt), 1)))
                print(json.dumps(rows[-1]), flush=True)
            recurrent.FUSED_OUTPUT_NORM = True
            del model
            torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["qwen3_next", "qwen3_5_text", "kimi_linear"])
