"""Prefill GPU time of a ~1B Qwen3.5-style hybrid (bf16, random) at B = 1, the delta rule's split prefill on (the
default) and off, in one process."""
import json, sys
import torch
sys.path.insert(0, ".")
from eval.speed import _model_maker, gpu_ms_of
import laquant.kernels.delta.chunk as dc

spec = 'qwen3_5_text:{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "vocab_size": 32000}'
label, make = _model_maker(spec)
model = make()
real = dc.splits_intra
for T in (4096, 16384, 32768):
    ids = torch.randint(0, 32000, (1, T), device="cuda")
    row = {"model": label, "T": T}
    with torch.no_grad():
        for name, rule in (("split_default", real), ("walk16", lambda *a: False)):
            dc.splits_intra = rule
            fn = lambda: model(ids, logits_to_keep=1)
            fn()
            row[f"{name}_gpu_ms"] = min(gpu_ms_of(fn) for _ in range(3))
            row[f"{name}_logit0"] = fn().logits[0, -1, :4].float().tolist()
    dc.splits_intra = real
    row["speedup"] = row["walk16_gpu_ms"] / row["split_default_gpu_ms"]
    print(json.dumps(row), flush=True)
