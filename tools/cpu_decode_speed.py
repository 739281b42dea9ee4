"""CPU decode ms/token: float32 vs gla_int8_all on torch._int_mm vs the float64 emulation.

    python tools/cpu_decode_speed.py THREADS [HIDDEN]   # no HIDDEN: the embedded gla-small

The model is gla-small (calibrated on the shipped text) or a random 4-layer GLA of that hidden size
(calibrated on random tokens: speed only). Results: eval/results/cpu_int8_decode.md.
"""
import json
import sys
import time

import torch

import laquant
import laquant.kernels.gemm.reference as gemm_reference
from laquant.adapters import cache_kwargs, returned_cache
from laquant.models import GLAConfig, GLAForCausalLM


@torch.no_grad()
def decode_ms(model, prompt, steps):
    out = model(prompt, use_cache=True)
    cache, nxt = returned_cache(out), out.logits[:, -1:].argmax(-1)
    for _ in range(2):
        model(nxt, **cache_kwargs(model, cache))
    t0 = time.perf_counter()
    for _ in range(steps):
        nxt = model(nxt, **cache_kwargs(model, cache)).logits[:, -1:].argmax(-1)
    return (time.perf_counter() - t0) / steps * 1e3


def main(threads: int, hidden: int | None = None) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    if hidden is None:
        from laquant.data import load_text, tokenize

        model, tok = laquant.load_model(None)
        ids = tokenize(load_text("calibration"), tok)
        prompt, calib, steps = ids[:128].view(1, -1), ids[: 8 * 256].view(8, 256), 64
    else:
        model = GLAForCausalLM(GLAConfig(hidden_size=hidden, num_hidden_layers=4, num_heads=8, vocab_size=32000)).eval()
        calib = torch.randint(0, 32000, (4, 256))
        prompt, steps = calib[:1, :64], 16
    row = {"hidden": hidden or "gla-small", "threads": threads, "torch": torch.__version__,
           "float32_ms_per_token": decode_ms(model, prompt, steps)}
    laquant.calibrate(model, "gla_int8_all", calib, progress=False)
    row["gla_int8_all_ms_per_token"] = decode_ms(model, prompt, steps)
    fast = gemm_reference.int8_matmul_exact
    gemm_reference.int8_matmul_exact = gemm_reference.int8_matmul_float64  # the emulation it replaced
    try:
        row["gla_int8_all_float64_emulation_ms_per_token"] = decode_ms(model, prompt, steps)
    finally:
        gemm_reference.int8_matmul_exact = fast
    print(json.dumps(row))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
