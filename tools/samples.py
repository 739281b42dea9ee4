"""Text samples from a model (recurrent decoding with the state cache), to read as a sanity check.

    python tools/samples.py [MODEL] [--tokens 80] [--device cpu]
"""

from __future__ import annotations

import argparse

import torch

from laquant.adapters import new_cache
from laquant.loading import load_model

PROMPTS = [
    "It was a dark and stormy night, and",
    "The history of the city begins in",
    "\"I cannot tell you,\" said she,",
    "In the morning the old man",
]


@torch.no_grad()
def generate(model, tokenizer, prompt: str, new_tokens: int, top_k: int = 40, temperature: float = 0.8,
             seed: int = 0) -> str:
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)
    cache = new_cache(model)
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
    out = []
    for _ in range(new_tokens):
        top = torch.topk(logits.float().cpu() / temperature, top_k)
        choice = top.indices[0, torch.multinomial(top.values.softmax(-1)[0], 1, generator=gen)]
        out.append(int(choice))
        logits = model(input_ids=choice.view(1, 1).to(device), past_key_values=cache, use_cache=True).logits[:, -1]
    return prompt + tokenizer.decode(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python tools/samples.py", description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--tokens", type=int, default=80)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    model, tokenizer = load_model(args.model, device=args.device)
    for i, prompt in enumerate(PROMPTS):
        print(f"--- sample {i + 1}\n{generate(model, tokenizer, prompt, args.tokens, seed=i)}\n")


if __name__ == "__main__":
    main()
