"""Experiment (issue #14): does a B = 64 decode step go faster as micro-batches whose graphs run side by side?

Each graphed decode step is a chain of ~300 small kernels, each mostly waiting on its own launch and memory
latency. Two independent chains (two halves of the batch, each its own captured step on its own static cache,
replayed on two streams) can fill each other's gaps. This times, per variant (bf16, the recipe):
the one B = 64 graph; ``n`` graphs of B = 64 / n replayed one after the other on one stream; the same replayed
side by side on ``n`` streams. Writes a JSON and prints a table.

    python3 tools/bench_microbatch.py OUT.json [gla|qwen3_next] [splits...]
"""

from __future__ import annotations

import json
import sys
import time

import torch

sys.path.insert(0, ".")
from eval.speed import recipe_variants  # noqa: E402
from laquant.generate import DecodeSession, release_graphs  # noqa: E402

GLA = 'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
HYBRID = ('qwen3_next:{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, '
          '"num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, '
          '"linear_num_value_heads": 32, "num_experts": 0}')


def session(model, prompt):
    # every capture on a stream of its own: the split-K tile counters and cuBLAS's workspace are per stream
    torch.cuda.graph.default_capture_stream = torch.cuda.Stream()
    release_graphs(model)  # a second session of the same shape captures its own graph and static cache
    s = DecodeSession(model, prompt, 200, graphed=True)
    return s


def time_steps(sessions, streams, steps=40, reps=3) -> float:
    """Seconds per step of all sessions (one replay each), best of ``reps``."""
    best = float("inf")
    for _ in range(reps):
        for s in sessions:
            s.graph.pos.fill_(1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            for s, st in zip(sessions, streams):
                with torch.cuda.stream(st):
                    s.graph.graph.replay()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / steps)
    return best


def main():
    out = sys.argv[1]
    which = sys.argv[2] if len(sys.argv) > 2 else "gla"
    splits = [int(x) for x in sys.argv[3:]] or [2]
    spec, recipe = (GLA, "gla_int8_all") if which == "gla" else (HYBRID, "hybrid_int8")
    B, T = 64, 512
    rows = []
    for label, variant, make in recipe_variants([spec], recipe):
        model = make()
        torch.manual_seed(1)
        prompt = torch.randint(0, model.config.vocab_size, (B, T), device="cuda")
        with torch.no_grad():
            whole = session(model, prompt)
            main_stream = torch.cuda.current_stream()
            row = {"model": label, "variant": variant, "B": B, "prompt": T,
                   "one_graph_ms": 1e3 * time_steps([whole], [main_stream])}
            for n in splits:
                parts = [session(model, prompt[i * B // n:(i + 1) * B // n]) for i in range(n)]
                streams = [torch.cuda.Stream() for _ in range(n)]
                row[f"split{n}_serial_ms"] = 1e3 * time_steps(parts, [main_stream] * n)
                row[f"split{n}_parallel_ms"] = 1e3 * time_steps(parts, streams)
                del parts
        rows.append(row)
        print(json.dumps(row), flush=True)
        del whole, model
        torch.cuda.empty_cache()
    for r in rows:
        base = r["one_graph_ms"]
        cells = [f"{r['variant']}: one graph {base:.3f} ms ({r['B'] / base * 1e3:,.0f} tok/s)"]
        for n in splits:
            p = r[f"split{n}_parallel_ms"]
            cells.append(f"{n} graphs serial {r[f'split{n}_serial_ms']:.3f}, parallel {p:.3f} ms "
                         f"({r['B'] / p * 1e3:,.0f} tok/s, {base / p:.2f}x)")
        print("; ".join(cells))
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
