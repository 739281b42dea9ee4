"""transformers' generate on a left-padded batch (prompts of several lengths), graph steps on against off: tokens/s
from the first new token to the last (as `eval speed`'s hf_generate columns), bf16 and quantized, random weights.
Before 2026-12-04 a padded batch decoded eagerly on the hybrids and was an error on laquant's GLA.

    python3 tools/bench_padded_generate.py OUT.json MODEL [MODEL ...]      (GPU)

MODEL as `laquant eval speed --model` takes it (`config:{json}` for laquant's GLA, `FAMILY:{json}` for a hybrid);
each in bf16 and with gla_int8_all (GLA) or hybrid_int8 (a hybrid). Prompts: B sequences of 512-1,024 tokens (seed
0), left-padded to the longest; B = 1 and 64; 32 steps.
"""
import json
import sys

import torch

from laquant.eval.speed import _StepClock, recipe_variants


def padded_prompts(B: int, vocab: int, shortest: int = 512, longest: int = 1024):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(shortest, longest + 1, (B,), generator=g)
    lengths[0] = longest
    ids = torch.randint(1, vocab, (B, longest), generator=g)
    mask = (torch.arange(longest)[None] >= (longest - lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0).cuda(), mask.cuda()


def rate(model, ids, mask, steps: int) -> float:
    kw = dict(attention_mask=mask, max_new_tokens=steps + 1, min_new_tokens=steps + 1, do_sample=False,
              pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **kw)  # first-call costs (compilation, graph captures)
        clock = _StepClock()
        model.generate(ids, streamer=clock, **kw)
    return ids.shape[0] * steps / (clock.times[-1] - clock.times[1])


def main():
    out, models = sys.argv[1], sys.argv[2:]
    rows = []
    for label, variant, make in recipe_variants(models, "gla_int8_all"):
        model = make()
        for B in (1, 64):
            ids, mask = padded_prompts(B, model.config.vocab_size)
            for graphs in (True, False):
                model.laquant_graph_steps = graphs
                row = dict(model=label, variant=variant, B=B, graph_steps=graphs, tok_per_s=rate(model, ids, mask, 32),
                           graphs=len(model.__dict__.get("_laquant_step_graphs", {})))
                rows.append(row)
                print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, models=models, steps=32,
                       prompts="512-1,024 tokens, left-padded", rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
