"""Why two prefill timings disagree (diagnostic, issue #14): a random 1.37B GLA's eager 4K prefill timed three ways,
with the sequence-parallel prefill's piece bounds kept per shape (as shipped) and made at every call (as before):
the host's enqueue time of one call (perf_counter, no sync inside), the wall clock of one call with a sync (median),
and triton's do_bench (back-to-back calls, events; what `laquant eval speed`'s prefill row uses).

    python tools/diag_prefill_timing.py OUT.json
"""
import json
import sys
import time

import torch
from triton.testing import do_bench

import laquant.kernels.gla.chunk as chunk
from laquant.models import GLAConfig
from profile_prefill import random_gla  # tools/ is on sys.path when run as a script


def host_and_wall(fn, reps=15):
    host, wall = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
    return sorted(host)[reps // 2], sorted(wall)[reps // 2]


@torch.no_grad()
def main(out):
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    kept = chunk._piece_bounds

    def uncached(B, T, length, device):
        chunk._PIECE_BOUNDS.clear()
        return kept(B, T, length, device)

    for heads in (16, 4):
        cfg = GLAConfig(hidden_size=2048, num_hidden_layers=24, num_heads=heads, vocab_size=32000)
        for variant in ("bf16", "gla_int8_all"):
            model = random_gla(cfg, variant)
            ids = torch.randint(0, 32000, (1, 4096), device="cuda")
            for use_cache in (False, True):
                fn = lambda: model(ids, logits_to_keep=1, use_cache=use_cache)  # noqa: E731
                for bounds in ("kept", "every call"):
                    chunk._piece_bounds = kept if bounds == "kept" else uncached
                    for _ in range(3):
                        fn()
                    host, wall = host_and_wall(fn)
                    bench = do_bench(fn, warmup=25, rep=1000, return_mode="median")
                    key = f"H{heads} {variant} use_cache={use_cache} bounds {bounds}"
                    res[key] = dict(host_ms=host, wall_ms=wall, do_bench_ms=bench)
                    print(key, {k: round(v, 2) for k, v in res[key].items()}, flush=True)
            chunk._piece_bounds = kept
            del model
            torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
