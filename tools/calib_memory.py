"""Peak GPU memory of calibration: the whole model on the GPU vs one decoder layer at a time.

    python tools/calib_memory.py [MODEL] --samples 32 --seq-len 2048 --json out.json   (needs CUDA)

MODEL: a model directory, or ``config:{json}`` for a randomly initialised GLA of that config (peak
memory depends on the shapes, not on the weights; the shipped tokenizer reads the calibration text).
Both runs collect the same statistics (tests/test_calibrate.py checks they are equal); the
layer-by-layer run keeps the model and the hidden states between layers in CPU memory.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from laquant.errors import LaquantError


def measure(model_spec, samples: int, seq_len: int, batch_size: int) -> dict:
    from laquant.adapters import get_adapter
    from laquant.calibration.run import calibration_batches, collect_stats
    from laquant.data import load_text, tokenize
    from laquant.loading import load_model, load_tokenizer
    from laquant.models import GLAConfig, GLAForCausalLM

    if not torch.cuda.is_available():
        raise LaquantError("calib_memory measures GPU memory and needs a CUDA device")

    def make():
        if str(model_spec).startswith("config:"):
            torch.manual_seed(0)
            cfg = GLAConfig(**json.loads(model_spec[len("config:"):]))
            return GLAForCausalLM(cfg).to(torch.bfloat16).eval(), load_tokenizer(None)
        return load_model(model_spec, device="cpu", dtype=torch.bfloat16)

    rows = {}
    for mode in ("whole model on the GPU", "layer by layer"):
        model, tokenizer = make()
        batches = calibration_batches(tokenize(load_text("calibration"), tokenizer), samples, seq_len)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        if mode == "layer by layer":
            collect_stats(model, get_adapter(model), batches, batch_size=batch_size, progress=False,
                          layerwise_device="cuda")
        else:
            model.to("cuda")
            collect_stats(model, get_adapter(model), batches, batch_size=batch_size, progress=False)
        torch.cuda.synchronize()
        rows[mode] = {"peak_GiB": torch.cuda.max_memory_allocated() / 2**30, "seconds": time.time() - t0}
        del model
    params = sum(p.numel() for p in make()[0].parameters())
    return {"model": str(model_spec), "parameters": params, "samples": samples, "seq_len": seq_len,
            "batch_size": batch_size, "device": torch.cuda.get_device_name(), "rows": rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    result = measure(args.model, args.samples, args.seq_len, args.batch_size)
    for mode, row in result["rows"].items():
        print(f"{mode:>24}: peak {row['peak_GiB']:.3f} GiB, {row['seconds']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
