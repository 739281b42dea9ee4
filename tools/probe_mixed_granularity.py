"""Probe (issue #14): the graphed decode step of the random 1.37B GLA with per-token activation codes where a norm
makes them (q/k/v/g and gate/up: the norm sees the whole row) and per-group codes where a kernel sees only part of
a row (o_proj's from the GLA decode kernel, a head at a time; down's from SwiGLU, a group at a time). Built by
moving the per-group model's o_proj and down_proj into the per-token one (both calibrated from the same seed and
tokens); timed against bf16, per token and per group, in alternating rounds, B = 64 and B = 1.

    python3 tools/probe_mixed_granularity.py OUT.json [--rounds 3] [--prompt 512]
"""
import argparse
import json

import torch

from profile_prefill import random_gla
from step_ablation import replay_us

from laquant.models import GLAConfig

PER_GROUP = "gla_int8_all+projections.act_granularity=per_group"


def mixed(cfg: GLAConfig):
    model, donor = random_gla(cfg, "gla_int8_all"), random_gla(cfg, PER_GROUP)
    for layer, giver in zip(model.model.layers, donor.model.layers):
        layer.attn.o_proj, layer.mlp.down_proj = giver.attn.o_proj, giver.mlp.down_proj
    return model


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--layers", type=int, default=24)
    args = p.parse_args()
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=args.layers, num_heads=16, vocab_size=32000)
    models = {"bf16": random_gla(cfg, "bf16"), "per_token": random_gla(cfg, "gla_int8_all"),
              "per_group": random_gla(cfg, PER_GROUP), "mixed": mixed(cfg)}
    ids = torch.randint(0, cfg.vocab_size, (64, args.prompt), device="cuda")
    logits = {k: m(ids[:4, :256]).logits.float() for k, m in models.items()}
    ref = logits["bf16"]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "prompt": args.prompt,
              "logits_rel_err_vs_bf16": {k: ((v - ref).norm() / ref.norm()).item() for k, v in logits.items()},
              "us_per_step": {}}
    for batch in (64, 1):
        times = {k: [] for k in models}
        for _ in range(args.rounds):
            for k, m in models.items():
                times[k].append(replay_us(m, ids[:batch]))
        result["us_per_step"][f"B{batch}"] = times
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        result[f"median_B{batch}"] = med
        result[f"speedup_vs_bf16_B{batch}"] = {k: med["bf16"] / v for k, v in med.items()}
    print(json.dumps(result, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
