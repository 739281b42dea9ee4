"""Experiment: the trained gla-small calibrated with RECIPE (argv[1]); then the projections the recipe kept in bf16 (over
``outlier_max_fraction``) replaced by weight-only int8 (W8A16: per-channel int8 weights, activations as they are).
Perplexity on the first 32,768 wikitext2 tokens, prefill, context 2048, stride 1024. CPU, float32.

    python eval/results/weight_only_fallback_gla-small_cpu/experiment.py gla_int8
"""
import json
import torch
import laquant
from laquant.loading import load_model, load_tokenizer
from laquant.data import load_text, tokenize
from laquant.quant.modules import QuantLinear
from laquant.eval.ppl import perplexity

tok = load_tokenizer()
eval_ids = tokenize(load_text("wikitext2"), tok)[:32768]
calib = tokenize(load_text("calibration"), tok)

def ppl(model, mode="prefill"):
    with torch.no_grad():
        return perplexity(model, eval_ids, context=2048, stride=1024, mode=mode, progress=False).ppl

import sys
RECIPE = sys.argv[1]
out = {}
model = load_model()[0]
out["bf16"] = ppl(model)
print(out, flush=True)
result = laquant.calibrate(model, RECIPE, calib, samples=128, seq_len=2048, progress=False)
out[RECIPE] = ppl(model)
kept = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not isinstance(m, QuantLinear)
        and n.split(".")[-1] in ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]
out["kept_bf16"] = kept
for name in kept:
    parent, _, leaf = name.rpartition(".")
    lin = model.get_submodule(name)
    setattr(model.get_submodule(parent), leaf,
            QuantLinear.from_linear(lin, torch.empty(0, dtype=torch.long), "per_channel", "none"))
out[RECIPE + "_weight_only_fallback"] = ppl(model)
print(json.dumps(out, indent=1), flush=True)
