"""What the GLA decode step's low-rank gate costs in a graphed step (issue #14): a random 1.37B GLA (bf16 and
gla_int8_all) decodes graphed at B = 1 and 64 with the gate's own kernel on a side stream beside the q/k/v/g GEMM
(``shipped``; bf16's gate is two cuBLAS GEMMs and the tail kernel there), in order on the main stream
(``in_order``), and with no gate kernel at all (``no_gate``: log_decay returns a buffer made before the capture, the
bound of any fusion that removes the launch). Each configuration alternated twice in one process; tokens/s over 64
replays after a 512-token prompt (eval/results/fused_gate_h200/).

    python3 tools/gate_bound_probe.py OUT.json
"""
import json
import os
import sys

import torch

from profile_prefill import random_gla

from eval.speed import _decode_rate
from laquant.models import GLAConfig
from laquant.models.gla import GatedLinearAttention

SHIPPED = GatedLinearAttention.log_decay
_BUFFERS: dict = {}


def no_gate(self, x):
    key = (tuple(x.shape[:-1]), self.key_dim // self.num_kv_groups, x.device)
    if key not in _BUFFERS:
        _BUFFERS[key] = torch.full((*key[0], key[1]), -0.01, dtype=torch.float32, device=x.device)
    return _BUFFERS[key]


def configure(model, name: str, batch: int) -> None:
    model.__dict__.pop("_laquant_decode_graphs", None)  # capture again under this configuration
    os.environ["LAQUANT_SIDE_STREAM"] = "0" if name == "in_order" else "1"
    GatedLinearAttention.log_decay = no_gate if name == "no_gate" else SHIPPED
    if name == "no_gate":  # the decode step's buffers exist before the capture
        attn = model.model.layers[0].attn
        no_gate(attn, torch.empty(batch, 1, model.config.hidden_size, device="cuda"))


def main(out: str) -> None:
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=24, num_heads=16, vocab_size=32000)
    rows = []
    for variant in ("bf16", "gla_int8_all"):
        GatedLinearAttention.log_decay = SHIPPED  # calibration observes the gate
        model = random_gla(cfg, variant)
        for B in (64, 1):
            prompt = torch.randint(0, cfg.vocab_size, (B, 512), device="cuda")
            for rep in (1, 2):
                for name in ("shipped", "in_order", "no_gate"):
                    configure(model, name, B)
                    rate = _decode_rate(model, prompt, 64, graphed=True)
                    rows.append(dict(variant=variant, batch=B, rep=rep, config=name, tok_per_s=round(rate, 1)))
                    print(json.dumps(rows[-1]), flush=True)
        del model
        torch.cuda.empty_cache()
    GatedLinearAttention.log_decay = SHIPPED
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "config": cfg.to_dict()}
    with open(out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
