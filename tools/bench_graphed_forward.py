"""The calls that score text, eager against replayed (laquant.serving.graphed_forward), bf16 against gla_int8_all, on
one GPU and in one process: a random 1.37B GLA (2048 x 24, speed only) calibrated on random tokens.

* ``forward``: ``model(ids)`` without a cache at batch x tokens (lm-eval's ``HFLM`` call), synced wall medians; the
  replay's first call (its capture) apart; the logits' largest difference from the eager call's (0 at a bucket's
  length);
* ``lm_eval_like``: 64 requests of 100-1,000 tokens one at a time (lm-eval's default batch of 1), in one order;
* ``ppl_prefill``: ``laquant.eval.ppl.perplexity`` in prefill mode (40 windows of 1,024, stride 512, batches of 4) on
  random tokens, eagerly and graphed (its ``graphed`` default), captures included.

    python3 tools/bench_graphed_forward.py --out DIR     # DIR/graphed_forward.json, .md, .png
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from profile_prefill import random_gla  # noqa: E402

from laquant.eval.ppl import perplexity  # noqa: E402
from laquant.models import GLAConfig  # noqa: E402
from laquant.serving.graphed_forward import forward_graphs  # noqa: E402
from laquant.serving.graphed_prefill import bucket_for  # noqa: E402

CONFIG = dict(hidden_size=2048, num_hidden_layers=24, num_heads=16, vocab_size=32000)
SHAPES = [(1, 128), (1, 512), (1, 1000), (1, 2048), (2, 2048), (4, 1024), (8, 512)]  # <= HOST_BOUND_TOKENS


DEVICE = "cuda"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def synced(fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def forward_rows(model, variant, reps, shapes=SHAPES):
    rows = []
    for batch, tokens in shapes:
        ids = torch.randint(0, CONFIG["vocab_size"], (batch, tokens), device=DEVICE)
        with torch.no_grad():
            model.laquant_graph_forward = False
            synced(lambda: model(ids))
            eager = [synced(lambda: model(ids))[0] for _ in range(reps)]
            ref = model(ids).logits
            model.laquant_graph_forward = True
            capture, out = synced(lambda: model(ids).logits)
            replay = [synced(lambda: model(ids))[0] for _ in range(reps)]
            replayed = any(k[:2] == (batch, bucket_for(tokens)) for k in forward_graphs(model).captures)
        diff = (out.float() - ref.float()).abs().max().item()
        e, r = statistics.median(eager) * 1e3, statistics.median(replay) * 1e3
        rows.append(dict(variant=variant, batch=batch, tokens=tokens, eager_ms=round(e, 2), graphed_ms=round(r, 2),
                         capture_ms=round(capture * 1e3, 1), speedup=round(e / r, 2),
                         eager_tok_per_s=round(batch * tokens / e * 1e3),
                         graphed_tok_per_s=round(batch * tokens / r * 1e3),
                         max_abs_diff=diff, max_rel_diff=diff / ref.float().abs().max().item(),
                         finite=bool(torch.isfinite(out).all()), replayed=replayed))
        print(json.dumps(rows[-1]), flush=True)
    forward_graphs(model).captures.clear()
    return rows


def lm_eval_like(model, variant):
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(100, 1001, (64,), generator=gen).tolist()
    requests = [torch.randint(0, CONFIG["vocab_size"], (1, n), generator=gen).to(DEVICE) for n in lengths]
    out = {}
    with torch.no_grad():
        for graphed in (False, True):  # two passes each: the first compiles (eager) or captures (graphed)
            model.laquant_graph_forward = graphed
            key = "graphed" if graphed else "eager"
            for rep in ("first", "second"):
                t, _ = synced(lambda: [model(r).logits[0, -1].float().sum() for r in requests])
                out[f"{key}_{rep}_s"] = round(t, 3)
        out["captures"] = len(forward_graphs(model).captures)
    forward_graphs(model).captures.clear()
    row = dict(variant=variant, requests=len(requests), tokens=sum(lengths), **out,
               speedup=round(out["eager_second_s"] / out["graphed_second_s"], 2),
               speedup_with_captures=round(out["eager_second_s"] / out["graphed_first_s"], 2))
    print(json.dumps(row), flush=True)
    return row


def ppl_prefill(model, variant):
    ids = torch.randint(0, CONFIG["vocab_size"], (1024 + 39 * 512,), generator=torch.Generator().manual_seed(1))
    row = dict(variant=variant)
    model.laquant_graph_forward = False
    with torch.no_grad():  # the eager kernels compiled and autotuned before the clock
        model(ids[:4 * 1024].view(4, 1024).to(DEVICE))
    for graphed in (False, True):
        t, res = synced(lambda: perplexity(model, ids, context=1024, stride=512, batch_size=4, progress=False,
                                           graphed=graphed))
        key = "graphed" if graphed else "eager"
        row.update({f"{key}_s": round(t, 3), f"{key}_nll": res.nll, f"{key}_replayed": res.graphed})
    forward_graphs(model).captures.clear()
    row["speedup"] = round(row["eager_s"] / row["graphed_s"], 2)
    row["windows"] = 40
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="a 2-layer 256-wide model on the CPU: the tool's own test")
    args = ap.parse_args()
    global DEVICE
    if args.smoke:
        DEVICE = "cpu"
        CONFIG.update(hidden_size=256, num_hidden_layers=2, num_heads=2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", torch=torch.__version__,
                  config=CONFIG, forward=[], lm_eval_like=[], ppl_prefill=[])
    for variant in ("bf16", "gla_int8_all"):
        model = random_gla(GLAConfig(**CONFIG), variant, device=DEVICE)
        result["forward"] += forward_rows(model, variant, args.reps)
        result["lm_eval_like"].append(lm_eval_like(model, variant))
        result["ppl_prefill"].append(ppl_prefill(model, variant))
        del model
        torch.cuda.empty_cache()
    write(result, out)


def write(result, out):
    (out / "graphed_forward.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result, out / "graphed_forward.md")
    plot(result, out / "graphed_forward.png")


def write_markdown(result, path):
    by = {(r["variant"], r["batch"], r["tokens"]): r for r in result["forward"]}
    lines = [f"{result['device']}, torch {result['torch']}, random GLA {result['config']}", "",
             "| batch x tokens | bf16 eager ms | bf16 graphed ms | int8_all eager ms | int8_all graphed ms | "
             "int8/bf16 eager | int8/bf16 graphed | capture ms (bf16 / int8) | max diff (bf16 / int8) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for batch, tokens in SHAPES:
        b, q = by[("bf16", batch, tokens)], by[("gla_int8_all", batch, tokens)]
        lines.append(f"| {batch} x {tokens} | {b['eager_ms']} | {b['graphed_ms']} | {q['eager_ms']} "
                     f"| {q['graphed_ms']} "
                     f"| {b['eager_ms'] / q['eager_ms']:.2f}x | {b['graphed_ms'] / q['graphed_ms']:.2f}x "
                     f"| {b['capture_ms']} / {q['capture_ms']} | {b['max_abs_diff']:.3g} / {q['max_abs_diff']:.3g} |")
    lines += ["", "| variant | lm-eval-like eager s | graphed s (first pass, captures in it) | speedup (first) "
              "| ppl prefill eager s | graphed s | speedup | nll eager / graphed |",
              "|---|---|---|---|---|---|---|---|"]
    for le, pp in zip(result["lm_eval_like"], result["ppl_prefill"]):
        lines.append(f"| {le['variant']} | {le['eager_second_s']} | {le['graphed_second_s']} ({le['graphed_first_s']}) "
                     f"| {le['speedup']}x ({le['speedup_with_captures']}x) | {pp['eager_s']} | {pp['graphed_s']} "
                     f"| {pp['speedup']}x | {pp['eager_nll']:.6f} / {pp['graphed_nll']:.6f} |")
    path.write_text("\n".join(lines) + "\n")


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{b}x{t}" for b, t in SHAPES]
    width = 0.2
    for i, (variant, mode) in enumerate([(v, m) for v in ("bf16", "gla_int8_all") for m in ("eager", "graphed")]):
        ys = [r[f"{mode}_tok_per_s"] for r in result["forward"] if r["variant"] == variant]
        ax.bar([x + (i - 1.5) * width for x in range(len(labels))], ys, width, label=f"{variant} {mode}")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("tokens/s (cacheless forward)")
    ax.set_title(f"model(ids) eager vs replayed, {result['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
