"""Eager decode of a random Kimi Linear model with its MLA layers in the absorbed form (laquant) against
transformers' forward (every cached latent re-projected through kv_b_proj each step), same weights, same run.

    python tools/bench_mla_decode.py [--device cpu] [--context 2048] [--batch 1 8] [--steps 16]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import KimiLinearConfig, KimiLinearForCausalLM

from laquant.adapters import install, new_cache
from laquant.models import mla_attention
from laquant.models.quantizing_rowwise import original_class


def model_for(device, dtype):
    torch.manual_seed(0)
    cfg = KimiLinearConfig(vocab_size=32000, hidden_size=1024, num_hidden_layers=8, intermediate_size=2816,
                           num_attention_heads=8, num_key_value_heads=8, q_lora_rank=None, kv_lora_rank=512,
                           qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, linear_num_heads=8,
                           linear_head_dim=128, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=512,
                           num_shared_experts=1, layer_types=["linear_attention"] * 3 + ["full_attention"] + 
                           ["linear_attention"] * 3 + ["full_attention"], mlp_layer_types=["dense"] * 8,
                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = KimiLinearForCausalLM(cfg).to(device, dtype).eval()
    install(model)
    return model


def set_absorbed(model, on: bool):
    if on:
        mla_attention.install(model.model.layers)
        return
    for m in model.modules():
        if original_class(m).__name__ in mla_attention.MLA_ATTENTIONS:
            m.__class__ = original_class(m)


@torch.no_grad()
def decode_tok_per_s(model, B, context, steps, device):
    ids = torch.randint(1, 32000, (B, context), generator=torch.Generator().manual_seed(B)).to(device)
    cache = new_cache(model)
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
    tok = logits.argmax(-1, keepdim=True)
    out = []
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        logits = model(input_ids=tok, past_key_values=cache, use_cache=True).logits[:, -1]
        tok = logits.argmax(-1, keepdim=True)
        out.append(logits)
    sync()
    return B * steps / (time.perf_counter() - t0), torch.stack(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    model = model_for(args.device, torch.float32)
    for B in args.batch:
        row = {"device": args.device, "torch": torch.__version__, "threads": torch.get_num_threads(), "B": B,
               "context": args.context, "steps": args.steps, "dtype": "float32",
               "model": "random Kimi Linear 1024x8 (MLA every 4th, kv_lora_rank 512)"}
        set_absorbed(model, False)
        row["transformers_tok_per_s"], want = decode_tok_per_s(model, B, args.context, args.steps, args.device)
        set_absorbed(model, True)
        row["absorbed_tok_per_s"], got = decode_tok_per_s(model, B, args.context, args.steps, args.device)
        row["speedup"] = row["absorbed_tok_per_s"] / row["transformers_tok_per_s"]
        row["max_abs_logit_diff"] = (got - want).abs().max().item()
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
