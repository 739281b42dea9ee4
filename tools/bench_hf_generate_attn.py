"""transformers' generate on laquant's GLA with fla softmax attn layers, graph steps on against off (eager steps),
tokens/s from the first new token to the last (as `eval speed`'s hf_generate columns), bf16, random weights:
a 1.37B GLA (2048 x 24, 16 heads) whose layers 11 and 23 are softmax attention (GQA, 4 key heads).

    python3 tools/bench_hf_generate_attn.py OUT.json     (GPU)
"""
import json
import sys

import torch

from laquant.eval.speed import _hf_generate_rate
from laquant.models import GLAConfig, GLAForCausalLM


def attn_gla_1b() -> GLAForCausalLM:
    """The random bf16 1.37B GLA (2048 x 24, 16 heads) whose layers 11 and 23 are softmax attention (GQA, 4 key
    heads), on CUDA."""
    torch.manual_seed(0)
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=24, num_heads=16, vocab_size=32000, bos_token_id=0,
                    eos_token_id=0, attn={"layers": [11, 23], "num_heads": 16, "num_kv_heads": 4})
    with torch.device("cuda"):
        model = GLAForCausalLM(cfg)
    return model.to(torch.bfloat16).eval()


def main():
    model = attn_gla_1b()
    rows = []
    for B in (1, 64):
        prompt = torch.randint(1, 32000, (B, 1024), device="cuda")
        for graphs in (True, False):
            model.laquant_graph_steps = graphs
            rate = _hf_generate_rate(model, prompt, 32)
            rows.append(dict(B=B, graph_steps=graphs, tok_per_s=rate,
                             graphs=len(model.__dict__.get("_laquant_step_graphs", {}))))
            print(json.dumps(rows[-1]), flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), config=model.config.to_dict(), prompt=1024, steps=32,
                   rows=rows), open(sys.argv[1], "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
