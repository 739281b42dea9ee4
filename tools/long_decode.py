"""Long-decode stability: decode N tokens token by token through a quantized model's recurrent
state and report, by position, the loss, the non-finite logits and the saturation counts (state at
its format's limit, gate logits clamped: laquant/eval/saturation.py). Writes JSON and a PNG.

    python tools/long_decode.py OUT_CHECKPOINT --tokens 65536 --batch 4 --device cuda --out runs/long
    python tools/long_decode.py gla-small --recipe gla_int8_all --tokens 65536 --device cuda --out runs/long
    python tools/long_decode.py gla-small --recipe gla_int8 --set state.renorm_interval=0 --tokens 4096 ...

MODEL: a laquant checkpoint (decoded as saved) or a plain model, quantized here with ``--recipe``
(calibrated on ``--calib-samples`` x ``--calib-seq-len`` tokens of the shipped calibration text, or
with ``--stats`` from an earlier run). The B sequences are teacher-forced: token t + 1 of each is
scored from the state after tokens 0..t; they are B windows of the ``--data`` text (wikitext2 with
the calibration text after it, repeated if N + 1 tokens need more), starting ``(len - N - 1) / B``
apart. Counts are summed over the B sequences in buckets of ``--bucket`` positions.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch


def token_streams(ids: torch.Tensor, n: int, batch: int) -> torch.Tensor:
    """``[batch, n + 1]`` windows of ``ids`` (repeated if it is shorter than ``n + 1``)."""
    if len(ids) < n + 1:
        ids = ids.repeat(-(-(n + 1) // len(ids)))
    step = max((len(ids) - n - 1) // max(batch, 1), 0)
    return torch.stack([ids[i * step:i * step + n + 1] for i in range(batch)])


def load_quantized(args):
    import laquant
    from laquant.checkpoint import read_quantization_config
    from laquant.paths import resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    dtype = getattr(torch, args.dtype)
    if read_quantization_config(model_dir) is not None:
        if args.recipe:
            raise SystemExit(f"{model_dir} is a laquant checkpoint already; drop --recipe")
        model, tok = laquant.load(model_dir, device=args.device, dtype=dtype)
        return model, tok, "checkpoint"
    model, tok = laquant.load_model(model_dir, device=args.device, dtype=dtype)
    if not args.recipe:
        return model, tok, "unquantized"
    from laquant.calibration.stats import Stats
    from laquant.data import load_text, tokenize
    from laquant.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.set)
    stats = Stats.load(args.stats) if args.stats else None
    data = None if stats else tokenize(load_text("calibration"), tok)
    laquant.calibrate(model, recipe, data=data, stats=stats, samples=args.calib_samples,
                      seq_len=args.calib_seq_len, progress=not args.quiet)
    return model, tok, recipe["name"]


@torch.no_grad()
def long_decode(model, streams: torch.Tensor, bucket: int, progress: bool = True) -> dict:
    from tqdm.auto import tqdm

    from laquant.adapters import cache_kwargs, new_cache
    from laquant.eval.ppl import decode_threads
    from laquant.eval.saturation import SaturationCounter

    device = next(model.parameters()).device
    streams = streams.to(device)
    batch, n = streams.shape[0], streams.shape[1] - 1
    buckets = -(-n // bucket)
    nll_sum = torch.zeros(buckets, dtype=torch.float64, device=device)
    nonfinite = torch.zeros(buckets, dtype=torch.int64, device=device)
    counter = SaturationCounter(model, n, bucket)
    cache = new_cache(model)
    t0 = time.perf_counter()
    try:
        with decode_threads(model, batch):
            for t in tqdm(range(n), desc="decoding", unit="tok", disable=not progress):
                logits = model(input_ids=streams[:, t:t + 1], **cache_kwargs(model, cache), use_cache=True).logits[:, 0]
                counter.after_step(cache)
                logits = logits.float()
                bad = ~torch.isfinite(logits)
                b = t // bucket
                nonfinite[b] += bad.sum()
                nll = torch.nn.functional.cross_entropy(logits.nan_to_num(0.0, 0.0, 0.0), streams[:, t + 1],
                                                        reduction="none")
                nll_sum[b] += nll.double().sum()
    finally:
        counter.close()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    per_bucket = torch.tensor([min(bucket, n - i * bucket) * batch for i in range(buckets)], dtype=torch.float64)
    loss = (nll_sum.cpu() / per_bucket).tolist()
    sat = counter.result()
    return {"tokens": n, "batch": batch, "bucket": bucket, "seconds": round(seconds, 2),
            "tokens_per_second": round(n * batch / seconds, 1),
            "nll": float(nll_sum.sum().cpu() / (n * batch)), "ppl": math.exp(float(nll_sum.sum().cpu() / (n * batch))),
            "nonfinite_logits": int(nonfinite.sum()), "loss_by_position": loss,
            "nonfinite_logits_by_position": nonfinite.cpu().tolist(), "saturation": sat}


def plot(result: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = result["bucket"]
    x = [i * b for i in range(len(result["loss_by_position"]))]
    sat = result["saturation"]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].plot(x, result["loss_by_position"])
    axes[0].set_ylabel("loss (nats)")
    axes[1].plot(x, sat["state_at_limit_fraction_by_position"], label="state at its format's limit")
    axes[1].plot(x, sat["gate_clamped_fraction_by_position"], label="gate logits clamped")
    axes[1].set_ylabel("fraction")
    axes[1].legend()
    axes[2].plot(x, result["nonfinite_logits_by_position"], label="non-finite logits")
    axes[2].plot(x, sat["state_nonfinite_by_position"], label="non-finite state elements")
    axes[2].set_ylabel("count")
    axes[2].set_xlabel(f"position (buckets of {b})")
    axes[2].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="gla-small", help="checkpoint folder, model folder, HF id or gla-small")
    p.add_argument("--recipe", default=None, help="quantize a plain model with this recipe first")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--stats", default=None, help="statistics to quantize with (instead of calibrating)")
    p.add_argument("--calib-samples", type=int, default=32)
    p.add_argument("--calib-seq-len", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=65536, help="positions decoded per sequence")
    p.add_argument("--batch", type=int, default=4, help="sequences decoded together")
    p.add_argument("--bucket", type=int, default=None, help="positions per bucket (default: tokens / 512, >= 1)")
    p.add_argument("--data", default="wikitext2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--out", required=True, help="folder for long_decode.json and long_decode.png")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    from laquant.data import load_text, tokenize

    model, tok, what = load_quantized(args)
    ids = tokenize(load_text(args.data), tok)
    if args.data == "wikitext2" and len(ids) < args.tokens + 1:
        ids = torch.cat([ids, tokenize(load_text("calibration"), tok)])
    bucket = args.bucket or max(1, args.tokens // 512)
    result = long_decode(model, token_streams(ids, args.tokens, args.batch), bucket, not args.quiet)
    formats = result["saturation"]["state_formats"]
    result.update(model=str(args.model), quantization=what, recipe_overrides=args.set, data=args.data,
                  device=args.device, dtype=args.dtype, torch=torch.__version__,
                  gpu=torch.cuda.get_device_name() if args.device.startswith("cuda") else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "long_decode.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out / "long_decode.png", f"{args.model} ({what}, state {', '.join(formats)}): "
                                          f"{args.tokens} tokens x {args.batch}")
    sat = result["saturation"]
    print(f"{what}: {args.tokens} tokens x {args.batch}, ppl {result['ppl']:.3f}, non-finite logits "
          f"{result['nonfinite_logits']}, non-finite state {sat['state_nonfinite']}, state at limit "
          f"{sat['state_at_limit_fraction']:.4%}, gates clamped {sat['gate_clamped_fraction']:.4%}, "
          f"{result['tokens_per_second']} tok/s; wrote {out}/long_decode.json, long_decode.png")
    return 0 if result["nonfinite_logits"] == 0 and sat["state_nonfinite"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
