"""The serving replay's greedy decode (`laquant.serving.replay.greedy_decode`, what `eval serve` decodes with) on
laquant's GLA with fla softmax attn layers, its captured one-token step against the eager loop it ran before
(`laquant.generate.is_graphable` patched to False), B = 1, tokens/s over 64 steps after a 1,024-token prefill, bf16,
random weights: a 1.37B GLA (2048 x 24, 16 heads) whose layers 11 and 23 are softmax attention (GQA, 4 key heads).

    python3 tools/bench_replay_attn.py OUT.json     (GPU)
"""
import json
import sys
import time

import torch
from bench_hf_generate_attn import attn_gla_1b

import laquant.generate as lg
from laquant.serving.replay import greedy_decode
from laquant.serving.speculative import parting_gaps

STEPS = 64


def _rate(model, prompt, graphed: bool) -> tuple[float, torch.Tensor]:
    """Tokens/s of the decode, and the first token (the prefill's) with the decoded ones."""
    real = lg.is_graphable
    lg.is_graphable = real if graphed else (lambda m: False)
    try:
        times, out = [], None
        for _ in range(3):  # the first call captures
            with torch.no_grad():
                logits = model(input_ids=prompt, use_cache=True)
            first = logits.logits[:, -1].argmax(-1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = torch.cat([first[:, None], greedy_decode(model, logits.past_key_values, first, STEPS)], 1)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return STEPS / min(times[1:]), out
    finally:
        lg.is_graphable = real


def main():
    model = attn_gla_1b()
    prompt = torch.randint(1, 32000, (1, 1024), device="cuda")
    rows, outs = [], {}
    for graphed in (True, False):
        rate, outs[graphed] = _rate(model, prompt, graphed)
        rows.append(dict(B=1, graphed=graphed, tok_per_s=rate))
        print(json.dumps(rows[-1]), flush=True)
    agree = int((outs[True] == outs[False]).cumprod(1).sum()) - 1  # the prefill's first token is shared
    with torch.no_grad():  # where they part: the two tokens' logit gap over the largest logit (eager, bf16)
        gaps = list(parting_gaps(model, torch.cat([prompt, outs[True]], 1), torch.cat([prompt, outs[False]], 1)))
    json.dump(dict(device=torch.cuda.get_device_name(), config=model.config.to_dict(), prompt=1024, steps=STEPS,
                   rows=rows, tokens_equal_before_first_parting=agree, parting_gaps=gaps), open(sys.argv[1], "w"),
              indent=1, default=str)
    print("tokens equal before the first parting:", agree, "of", STEPS, "parting (row, position, gap):", gaps)


if __name__ == "__main__":
    main()
