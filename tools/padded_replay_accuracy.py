"""How far a padded replay of a cacheless forward (laquant.serving.graphed_forward) moves a trained model's scores:
the shipped gla-small (bf16) and its gla_int8_all quantization on the GPU, WikiText-2 test text, each length scored
eagerly and replayed padded to its bucket; the largest logit difference (absolute and over the largest logit) and
the mean NLL of both.

    python3 tools/padded_replay_accuracy.py > OUT.txt
"""
import torch

import laquant
from laquant.api import load
from laquant.data import load_text, tokenize
from laquant.loading import load_tokenizer
from laquant.paths import default_model_dir
from laquant.serving.graphed_prefill import bucket_for

DEVICE = "cuda"


def main():
    model_dir = default_model_dir()
    tokenizer = load_tokenizer(model_dir)
    ids = tokenize(load_text("wikitext2"), tokenizer)[: 4 * 1024]
    print("variant tokens bucket max_abs_diff max_rel_diff nll_eager nll_replayed", flush=True)
    for variant in ("bf16", "gla_int8_all"):
        model, _ = load(model_dir, device=DEVICE, dtype=torch.bfloat16)
        if variant != "bf16":
            calib = tokenize(load_text("calibration"), tokenizer)[: 8 * 512].view(8, 512).to(DEVICE)
            model = laquant.calibrate(model, variant, data=calib, progress=False).model
        model.eval()
        for tokens in (1000, 700, 300, 1024):
            x = ids[:tokens][None].to(DEVICE)
            with torch.no_grad():
                model.laquant_graph_forward = False
                ref = model(x).logits.float()
                model.laquant_graph_forward = True
                out = model(x).logits.float()
            nll = [torch.nn.functional.cross_entropy(t[0, :-1], x[0, 1:]).item() for t in (ref, out)]
            diff = (out - ref).abs().max().item()
            print(variant, tokens, bucket_for(tokens), f"{diff:.4g}", f"{diff / ref.abs().max().item():.4g}",
                  f"{nll[0]:.6f}", f"{nll[1]:.6f}", flush=True)


if __name__ == "__main__":
    main()
